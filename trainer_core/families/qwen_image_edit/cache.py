"""The edit cache: target latents, control latents and image-conditioned prompt embeddings, on disk by content.

Keys (see cache.py for the text-to-image ones, whose files and helpers this shares):
- a target latent: exactly text-to-image's (image bytes, bucket, crop recipe, VAE identity);
- a control latent: the control's bytes and decoding, the variant's sizing rule and the VAE image size, the
  VAE's identity;
- a prompt embedding: the prompt, every control's bytes, decoding and encoder-image size in order, the
  variant's pipeline (template, "Picture N" slots) and the text encoder's identity (tokenizer and vision
  tower included). Identities are `components.fingerprint(part)`.

Per sample the caption is encoded with its controls, and so is the empty caption (caption dropout keeps the
images: the edit model always sees them). Preview and negative prompts are encoded with the first training
sample's controls, which the preview uses unless it is given others. Every entry is encoded alone, as in
cache.py, so a cache built across a kill equals one built in one go.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ...cache import (
    CACHE_VERSION, ENTRY_NAME, LIBRARY_TEMP_AGE, CachedDataset, CachedSample, CacheReport, _entry_ok, latent_key,
)
from ...data import load_cropped, open_image
from ...errors import UserInputError
from ...files import remove_leftovers, write_error, write_safetensors_atomic
from ...models.latents import encode_images
from .data import ControlImage, EditSample
from .pipelines import (
    ControlSize, check_control_aspect, control_size, edit_pipeline, encode_control_latents, encode_edit_prompt,
    prepare_control,
)

# Bump when the way control latents or image-conditioned prompts are made changes.
EDIT_CACHE_VERSION = "1"


@dataclass(frozen=True)
class EditCachedSample(CachedSample):
    control_keys: tuple[str, ...] = ()
    control_sizes: tuple[tuple[int, int], ...] = ()  # (width, height) of each control's VAE image
    empty_text_key: str = ""  # the empty caption with these controls (caption dropout)
    control_paths: tuple[str, ...] = ()

    @property
    def batch_group(self) -> tuple:
        """Samples of one micro-batch share the target's bucket and the controls' sizes (they are stacked)."""
        return (self.bucket, self.control_sizes)


@dataclass
class EditCachedDataset(CachedDataset):
    variant: str = "edit"
    control_resolution: int = 0
    # Whose controls the preview and negative prompts were encoded with (the first training sample).
    preview_sample: EditCachedSample | None = None


def control_key(control: ControlImage, size: ControlSize, variant, vae_fingerprint: str) -> str:
    parts = (CACHE_VERSION, EDIT_CACHE_VERSION, "control", variant.pipeline, control.sha256, control.decode,
             f"{size.vae[0]}x{size.vae[1]}", vae_fingerprint)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def edit_text_key(prompt: str, controls: tuple[ControlImage, ...], sizes: list[ControlSize], variant,
                  text_fingerprint: str) -> str:
    images = [f"{c.sha256}:{c.decode}:{s.condition[0]}x{s.condition[1]}" for c, s in zip(controls, sizes)]
    parts = (CACHE_VERSION, EDIT_CACHE_VERSION, "prompt", variant.pipeline, text_fingerprint, *images, prompt)
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def _sizes(sample: EditSample, variant, control_resolution: int) -> list[ControlSize]:
    """The sizes of a sample's controls under the variant's rule; a count or aspect the variant cannot take
    is refused by name."""
    if len(sample.controls) > variant.max_controls:
        raise UserInputError(
            f"image {Path(sample.image_path).name} has {len(sample.controls)} control images, but {variant.name} takes "
            f"{variant.max_controls}: remove the extra ({Path(sample.controls[variant.max_controls].path).name}) or "
            "train Edit-2509 / Edit-2511.")
    sizes = []
    for c in sample.controls:
        size = control_size(variant, c.width, c.height, control_resolution or None)
        check_control_aspect(c.path, c.width, c.height, size, control_resolution or None)
        sizes.append(size)
    return sizes


def build_edit_cache(
    components,
    samples: list[EditSample],
    cache_dir: str | Path,
    preview_prompts: list[str] = (),
    negative_prompt: str = "",
    batch_size: int = 4,  # entries per progress update (each is encoded alone)
    repeats: int = 1,
    progress: Callable[[int, int], None] | None = None,
    validation: list[EditSample] = (),
    control_resolution: int = 0,
) -> EditCachedDataset:
    """Encode what is not cached yet, then release the text encoder and park the VAE (as cache.build_cache)."""
    variant = components.edit
    if variant is None:
        raise UserInputError("the loaded model is a text-to-image Qwen-Image, but this dataset is an edit dataset: "
                             "load a Qwen-Image-Edit transformer (Edit, Edit-2509 or Edit-2511).")
    missing = [s for s in [*samples, *validation] if not getattr(s, "controls", ())]
    if missing:
        raise UserInputError(f"image {Path(missing[0].image_path).name} has no control images: an edit model trains on "
                             "an edit dataset (the Edit Dataset node).")
    cache_dir = Path(cache_dir)
    training, validation = list(samples), list(validation)
    everything = training + validation
    sizes = {s.image_path: _sizes(s, variant, control_resolution) for s in everything}
    vae_fp, text_fp = components.fingerprint("vae"), components.fingerprint("text_encoder")
    for kind in ("latents", "text"):
        remove_leftovers(cache_dir / kind, names=ENTRY_NAME, library_temps_older_than=LIBRARY_TEMP_AGE)
    preview = training[0]
    prompt_jobs: dict[str, tuple[str, EditSample]] = {}  # key -> (prompt, sample whose controls it sees)
    for s in everything:
        for prompt in (s.caption, ""):
            prompt_jobs[edit_text_key(prompt, s.controls, sizes[s.image_path], variant, text_fp)] = (prompt, s)
    preview_keys = {}
    for prompt in dict.fromkeys([*preview_prompts, negative_prompt, ""]):
        key = edit_text_key(prompt, preview.controls, sizes[preview.image_path], variant, text_fp)
        prompt_jobs[key], preview_keys[prompt] = (prompt, preview), key

    def exists(kind: str, key: str, name: str) -> bool:
        return _entry_ok(cache_dir / kind / f"{key}.safetensors", name)

    todo_targets = [s for s in everything if not exists("latents", latent_key(s, vae_fp), "latents")]
    controls = {control_key(c, z, variant, vae_fp): (c, s) for s in everything
                for c, z in zip(s.controls, sizes[s.image_path])}
    todo_controls = {k: v for k, v in controls.items() if not exists("latents", k, "latents")}
    todo_prompts = {k: v for k, v in prompt_jobs.items() if not exists("text", k, "embedding")}
    total, done = len(todo_targets) + len(todo_controls) + len(todo_prompts), 0

    def write(tensors, kind: str, key: str, what: str) -> None:
        nonlocal done
        try:
            write_safetensors_atomic(tensors, cache_dir / kind / f"{key}.safetensors")
        except OSError as e:
            raise write_error(e, f"cache entry of {what}", cache_dir / kind,
                              f"The {done} entries encoded before it are kept: the next run encodes only the rest.") from None
        done += 1
        if progress and (done % batch_size == 0 or done == total):
            progress(done, total)

    def condition_controls(sample: EditSample, pipe):
        return [prepare_control(variant, pipe, open_image(Path(c.path), sample.background, sample.allow_large_images),
                                control_resolution or None) for c in sample.controls]

    if todo_targets or todo_controls:
        vae = components.ensure_vae()
        pipe = edit_pipeline(variant, components, encoder=False)
        for s in todo_targets:  # alone: see cache.py
            pixels = load_cropped(s.image_path, s.bucket, s.background, s.allow_large_images).unsqueeze(0)  # (1, 3, H, W)
            write({"latents": encode_images(vae, pixels)[0]}, "latents", latent_key(s, vae_fp),
                  f"image {Path(s.image_path).name}")
        for key, (c, s) in todo_controls.items():
            image = open_image(Path(c.path), s.background, s.allow_large_images)
            prepared = prepare_control(variant, pipe, image, control_resolution or None)
            write({"latents": encode_control_latents(pipe, prepared.pixels, components.compute_dtype)}, "latents", key,
                  f"control image {Path(c.path).name}")
    if todo_prompts:
        components.ensure_text_encoder()
        pipe = edit_pipeline(variant, components)
        for key, (prompt, s) in todo_prompts.items():
            conditions = [p.condition for p in condition_controls(s, pipe)]
            write({"embedding": encode_edit_prompt(variant, pipe, prompt, conditions, components.device)}, "text", key,
                  f"prompt {prompt[:40]!r}")
    components.release_text_encoder()
    components.release_vae()

    def entry(s: EditSample) -> EditCachedSample:
        z = sizes[s.image_path]
        return EditCachedSample(
            latent_key=latent_key(s, vae_fp), text_key=edit_text_key(s.caption, s.controls, z, variant, text_fp),
            bucket=s.bucket, caption=s.caption, image_path=s.image_path,
            control_keys=tuple(control_key(c, size, variant, vae_fp) for c, size in zip(s.controls, z)),
            control_sizes=tuple(size.vae for size in z),
            empty_text_key=edit_text_key("", s.controls, z, variant, text_fp),
            control_paths=tuple(c.path for c in s.controls))

    report = CacheReport(
        latents_encoded=len(todo_targets) + len(todo_controls),
        latents_reused=len(everything) + len(controls) - len(todo_targets) - len(todo_controls),
        prompts_encoded=len(todo_prompts), prompts_reused=len(prompt_jobs) - len(todo_prompts))
    return EditCachedDataset(
        cache_dir=cache_dir, samples=[entry(s) for s in training], validation=[entry(s) for s in validation],
        prompt_keys=preview_keys, vae_fingerprint=vae_fp, text_fingerprint=text_fp, repeats=repeats,
        preview_prompts=list(preview_prompts), negative_prompt=negative_prompt, report=report,
        variant=variant.name, control_resolution=control_resolution, preview_sample=entry(preview))


def sample_controls(dataset: CachedDataset, samples: list[CachedSample]) -> list[list[torch.Tensor]] | None:
    """Per sample its control latents [(C, h_i, w_i)], or None for text-to-image samples (the trainer's hook)."""
    if not samples or not getattr(samples[0], "control_keys", ()):
        return None
    return [[dataset.latents(k).float() for k in s.control_keys] for s in samples]
