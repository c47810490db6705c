"""The Edit family's part of the shared cache (`cache.build_cache`): control latents and image-conditioned
prompt embeddings, on disk by content.

Keys (the target latents are the shared builder's, exactly text-to-image's):
- a control latent: the control's bytes and decoding, the variant's sizing rule and the VAE image size, the
  VAE's identity;
- a prompt embedding: the prompt, every control's bytes, decoding and encoder-image size in order, the
  variant's pipeline (template, "Picture N" slots) and the text encoder's identity (tokenizer and vision
  tower included). Identities are `components.fingerprint(part)`.

Per sample the caption is encoded with its controls, and so is the empty caption (caption dropout keeps the
images: the edit model always sees them). Preview and negative prompts are encoded with the first training
sample's controls (the shared builder asks for them with that sample), which the preview uses unless it is
given others. Every entry is encoded alone, as in cache.py, so a cache built across a kill equals one built
in one go.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ...core.errors import UserInputError
from ...data.cache import CACHE_VERSION
from ...data.images import open_image
from ..base import CacheConditioning
from ...data.edit_dataset import ControlImage, EditSample
from .variants import more_controls
from .pipelines import (
    ControlSize,
    check_control_aspect,
    control_size,
    edit_pipeline,
    encode_control_latents,
    encode_edit_prompt,
    prepare_control,
)

# Bump when the way control latents or image-conditioned prompts are made changes.
EDIT_CACHE_VERSION = "1"


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
            f"{more_controls(len(sample.controls))}.")
    sizes = []
    for c in sample.controls:
        size = control_size(variant, c.width, c.height, control_resolution or None)
        check_control_aspect(c.path, c.width, c.height, size, control_resolution or None)
        sizes.append(size)
    return sizes


class EditConditioning(CacheConditioning):
    """One cache build's controls: their sizes under the variant's rule (refused by name when the variant
    cannot take them), keys and encoding through the variant's pipeline."""

    def __init__(self, components, variant, samples: list[EditSample], control_resolution: int = 0):
        self.components, self.variant, self.control_resolution = components, variant, control_resolution
        self.sizes = {s.image_path: _sizes(s, variant, control_resolution) for s in samples}
        self.vae_fingerprint = components.fingerprint("vae")
        self.text_fingerprint = components.fingerprint("text_encoder")

    def text_key(self, prompt: str, sample: EditSample) -> str:
        return edit_text_key(prompt, sample.controls, self.sizes[sample.image_path], self.variant, self.text_fingerprint)

    def condition_jobs(self, sample: EditSample) -> dict:
        return {control_key(c, z, self.variant, self.vae_fingerprint): (c, sample)
                for c, z in zip(sample.controls, self.sizes[sample.image_path])}

    def entry_fields(self, sample: EditSample) -> dict:
        z = self.sizes[sample.image_path]
        return {"condition_keys": tuple(control_key(c, size, self.variant, self.vae_fingerprint)
                                        for c, size in zip(sample.controls, z)),
                "condition_sizes": tuple(size.vae for size in z),
                "condition_paths": tuple(c.path for c in sample.controls)}

    def _control_image(self, control: ControlImage, sample: EditSample):
        return open_image(Path(control.path), sample.background, sample.allow_large_images)

    def encode_conditions(self, jobs: dict, write) -> None:
        if not jobs:
            return
        pipe = edit_pipeline(self.variant, self.components, encoder=False)
        for key, (c, s) in jobs.items():
            prepared = prepare_control(self.variant, pipe, self._control_image(c, s), self.control_resolution or None)
            write({"latents": encode_control_latents(pipe, prepared.pixels, self.components.compute_dtype)},
                  "latents", key, f"control image {Path(c.path).name}")

    def encode_prompts(self, jobs: dict, write) -> None:
        pipe = edit_pipeline(self.variant, self.components)
        for key, (prompt, s) in jobs.items():
            conditions = [prepare_control(self.variant, pipe, self._control_image(c, s),
                                          self.control_resolution or None).condition for c in s.controls]
            write({"embedding": encode_edit_prompt(self.variant, pipe, prompt, conditions, self.components.device)},
                  "text", key, f"prompt {prompt[:40]!r}")
