"""Latent and prompt-embedding cache on disk, addressed by content.

A latent's key hashes the image bytes, its bucket, the crop recipe and the VAE's fingerprint; a prompt
embedding's key hashes the text, the text encoder's fingerprint (tokenizer included) and the template.
So a second run over the same data encodes nothing, a changed image is re-encoded alone, and a cache
written by another model simply misses. Files are safetensors written atomically (temp + rename); the
temporary files of a killed run are removed when the cache is next built.

Every image and every prompt is encoded alone (a batch of one): a latent computed beside others differs in
the last bits with its batch companions, and a cache must not depend on which entries a killed run had
written already. A cache built across a kill therefore equals, bit for bit, one built in one go.

Layout: <cache_dir>/latents/<key>.safetensors  {"latents": (C, h, w) fp32}
        <cache_dir>/text/<key>.safetensors     {"embedding": (L, D)}
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from .data import Sample, load_cropped
from .errors import UserInputError
from .files import os_error, remove_leftovers, write_error, write_safetensors_atomic
from .models.components import QwenImageComponents
from .models.latents import encode_images
from .models.text import encode_prompts, pipeline_prompt_constants

# Bump when the way latents or embeddings are produced changes: old entries then miss.
# 2: every image and prompt encoded alone (1 encoded them in batches, so entries depended on their companions).
CACHE_VERSION = "2"
# Cache entries' file names; `.<name>.PID.tmp` beside them is a killed write's leftover.
ENTRY_NAME = r"[0-9a-f]{32}\.safetensors"
# A bare safetensors temporary file this old (seconds) is a killed write's, not another run's in progress.
LIBRARY_TEMP_AGE = 600.0
CROP_RECIPE = "cover-lanczos-centre-crop"


@dataclass(frozen=True)
class CachedSample:
    latent_key: str
    text_key: str
    bucket: tuple[int, int]  # (width, height) in pixels
    caption: str
    image_path: str


@dataclass
class CacheReport:
    latents_encoded: int = 0
    latents_reused: int = 0
    prompts_encoded: int = 0
    prompts_reused: int = 0

    def summary(self) -> str:
        return (f"latents: {self.latents_encoded} encoded, {self.latents_reused} from cache; "
                f"prompts: {self.prompts_encoded} encoded, {self.prompts_reused} from cache")


@dataclass
class CachedDataset:
    """What the trainer needs: sample entries, prompt keys, and lazy access to the cached tensors."""

    cache_dir: Path
    samples: list[CachedSample]
    prompt_keys: dict[str, str]  # prompt text -> text key (preview prompts, negative prompt, "")
    vae_fingerprint: str
    text_fingerprint: str
    repeats: int | tuple[int, ...] = 1  # per epoch: one number for all samples, or one per sample
    preview_prompts: list[str] = field(default_factory=list)
    negative_prompt: str = ""
    # Held out of training (never in the data order): the validation loss is measured on these.
    validation: list[CachedSample] = field(default_factory=list)
    report: CacheReport = field(default_factory=CacheReport)
    _memory: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def latents(self, key: str) -> torch.Tensor:
        """(C, h, w) normalised latents."""
        return self._read("latents", key, "latents")

    def embedding(self, key: str) -> torch.Tensor:
        """(L, D) prompt embedding."""
        return self._read("text", key, "embedding")

    def prompt_embedding(self, prompt: str) -> torch.Tensor:
        if prompt not in self.prompt_keys:
            known = [p for p in self.prompt_keys if p]
            raise KeyError(prompt, known)
        return self.embedding(self.prompt_keys[prompt])

    def _read(self, kind: str, key: str, tensor_name: str) -> torch.Tensor:
        if key not in self._memory:
            path = self.cache_dir / kind / f"{key}.safetensors"
            try:
                self._memory[key] = load_file(str(path))[tensor_name]
            except (OSError, SafetensorError, KeyError) as e:  # deleted, moved or overwritten while in use
                error = os_error(e)
                reason = ("missing" if isinstance(e, FileNotFoundError)
                          else error.strerror if error is not None and error.strerror else e)
                raise UserInputError(
                    f"the cache entry {path} cannot be read ({reason}): the "
                    "cache folder was changed or deleted while this run used it. Run the Cache node again (or "
                    "restore the folder): only the missing entries are encoded.") from None
        return self._memory[key]


def latent_key(sample: Sample, vae_fingerprint: str) -> str:
    parts = (CACHE_VERSION, CROP_RECIPE, sample.image_sha256, f"{sample.bucket[0]}x{sample.bucket[1]}", vae_fingerprint)
    if sample.decode:  # transparency (its background) or high-bit grey: decoded differently from plain images
        parts += (sample.decode,)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def text_key(prompt: str, text_fingerprint: str) -> str:
    template, max_tokens = pipeline_prompt_constants()
    parts = (CACHE_VERSION, template, str(max_tokens), text_fingerprint, prompt)
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def _entry_ok(path: Path, tensor_name: str) -> bool:
    """An entry counts only if it is complete: a cut-short file (full disk, crash) is re-encoded."""
    if not path.is_file():
        return False
    try:
        with safe_open(str(path), framework="pt") as f:  # reads the header and checks the file's length
            return tensor_name in f.keys()
    except (SafetensorError, OSError, ValueError):
        return False


def build_cache(
    components: QwenImageComponents,
    samples: list[Sample],
    cache_dir: str | Path,
    preview_prompts: list[str] = (),
    negative_prompt: str = "",
    batch_size: int = 4,  # entries per progress update (each is encoded alone)
    repeats: int | tuple[int, ...] = 1,
    progress: Callable[[int, int], None] | None = None,
    validation: list[Sample] = (),
) -> CachedDataset:
    """Encode what is not cached yet, then release the text encoder and park the VAE on the CPU.

    The preview prompts and the negative prompt are encoded in the same pass; the empty prompt always
    is (caption dropout uses it). `validation` samples (held out of training) are cached the same way.
    """
    cache_dir = Path(cache_dir)
    training, validation = list(samples), list(validation)
    samples = training + validation
    report = CacheReport()
    vae_fp = components.fingerprint("vae")
    text_fp = components.fingerprint("text_encoder")
    for kind in ("latents", "text"):  # what killed runs left (only we write these folders)
        remove_leftovers(cache_dir / kind, names=ENTRY_NAME, library_temps_older_than=LIBRARY_TEMP_AGE)

    todo_latents = [s for s in samples if not _entry_ok(cache_dir / "latents" / f"{latent_key(s, vae_fp)}.safetensors", "latents")]
    prompts = list(dict.fromkeys([s.caption for s in samples] + list(preview_prompts) + [negative_prompt, ""]))
    todo_prompts = [p for p in prompts if not _entry_ok(cache_dir / "text" / f"{text_key(p, text_fp)}.safetensors", "embedding")]
    total = len(todo_latents) + len(todo_prompts)
    done = 0

    def write(tensors: dict[str, torch.Tensor], kind: str, key: str, what: str, metadata=None) -> None:
        try:
            write_safetensors_atomic(tensors, cache_dir / kind / f"{key}.safetensors", metadata)
        except OSError as e:
            raise write_error(e, f"cache entry of {what}", cache_dir / kind,
                              f"The {done} entries encoded before it are kept: the next run encodes only the rest."
                              ) from None

    if todo_latents:
        vae = components.ensure_vae()
        by_bucket: dict[tuple[int, int], list[Sample]] = {}
        for s in todo_latents:
            by_bucket.setdefault(s.bucket, []).append(s)
        for bucket_samples in by_bucket.values():
            for start in range(0, len(bucket_samples), batch_size):
                chunk = bucket_samples[start:start + batch_size]
                for s in chunk:  # alone: see the module docstring
                    pixels = load_cropped(s.image_path, s.bucket, s.background, s.allow_large_images).unsqueeze(0)  # (1, 3, H, W)
                    latent = encode_images(vae, pixels)[0]  # (C, h, w)
                    write({"latents": latent}, "latents", latent_key(s, vae_fp), f"image {Path(s.image_path).name}",
                          {"image": Path(s.image_path).name, "bucket": f"{s.bucket[0]}x{s.bucket[1]}"})
                    done += 1
                if progress:
                    progress(done, total)
    report.latents_encoded = len(todo_latents)
    report.latents_reused = len(samples) - len(todo_latents)

    if todo_prompts:
        components.ensure_text_encoder()
        for start in range(0, len(todo_prompts), batch_size):
            chunk = todo_prompts[start:start + batch_size]
            for prompt in chunk:  # alone: see the module docstring
                emb = encode_prompts(components.text_encoder, components.tokenizer, [prompt])[0]
                write({"embedding": emb}, "text", text_key(prompt, text_fp), f"prompt {prompt[:40]!r}")
                done += 1
            if progress:
                progress(done, total)
    report.prompts_encoded = len(todo_prompts)
    report.prompts_reused = len(prompts) - len(todo_prompts)

    components.release_text_encoder()
    components.release_vae()
    def entry(s: Sample) -> CachedSample:
        return CachedSample(latent_key=latent_key(s, vae_fp), text_key=text_key(s.caption, text_fp), bucket=s.bucket,
                            caption=s.caption, image_path=s.image_path)

    return CachedDataset(
        cache_dir=cache_dir, samples=[entry(s) for s in training], validation=[entry(s) for s in validation], prompt_keys={p: text_key(p, text_fp) for p in prompts},
        vae_fingerprint=vae_fp, text_fingerprint=text_fp, repeats=repeats, preview_prompts=list(preview_prompts),
        negative_prompt=negative_prompt, report=report,
    )
