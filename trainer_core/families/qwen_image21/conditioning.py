"""Qwen-Image 2.1's part of the shared cache (`cache.build_cache`): prompts alone, or with reference images.

A sample of a text-to-image dataset has its prompts encoded alone (`text.encode_prompt`, keyed by
`text_key`, as before). A sample of an edit dataset (data/edit_dataset.py's convention: a target, its
caption and 1 to 10 control images, here the references) has each prompt encoded *with* its references as the
pipeline does (references.py), cached as {"embedding": (L, D), "image_slots": (L,) bool}, and each reference's
latents (C, h_i, w_i). Caption dropout keeps the references (the empty caption is encoded with them), as for Edit.

Keys, by content:
- a reference latent: its bytes and decoding, its sized W x H, the VAE's identity;
- a prompt with references: the prompt, every reference's bytes, decoding and size in order, the text encoder's
  identity (tokenizer and vision tower included).
The reference size follows `control_resolution` (the Edit Dataset's setting; 0: the pipeline's 1024).

Transparency (DatasetConfig.transparency, "auto" or "keep": `images.keeps_alpha`): a transparent target or reference
is encoded as RGBA, as the pipeline encodes an RGBA image (its image processor's `preprocess` of the RGBA picture; an
RGB one it makes opaque), and the text encoder sees a transparent reference composited over white, as the pipeline's
`_get_qwen_prompt_embeds` does (whatever the dataset's background colour). With "flatten" every image is composited
onto the background first, as for the other families. Kept alpha is part of every key it changes (`decoding`).

Targets are encoded through the pipeline's own image processor too (the crop as a PIL image, its RGBA copy,
`image_processor.preprocess`): its tensor is laid out channels-last, and the CPU's convolutions round a
channels-last input differently from a contiguous one (by an ulp), so a target encoded so is bit-equal to what the
pipeline's pieces make of it, and a reference equal to a target gives the same latents. Their key says so.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ...data.cache import CACHE_VERSION, latent_key
from ...data.edit_dataset import EditSample
from ...data.images import cropped_image, keeps_alpha, open_image
from ...models.latents import encode_images
from ..base import CacheConditioning
from .references import (
    check_reference_size,
    encode_reference_latents,
    encode_reference_prompt,
    prepare_reference,
    reference_pipeline,
)
from .text import encode_prompt

NAME = "qwen-image-2.1"  # the family's name: part of its cache keys

# Bump when the way references or image-conditioned prompts are made changes.
REFERENCE_CACHE_VERSION = "1"
# Added to the shared target key: targets encoded through the pipeline's image processor (module docstring).
TARGET_RECIPE = "qwen-image-2.1-pipeline-preprocess-1"
ALPHA_KEPT = "alpha kept"  # in the key of an image encoded with its transparency (module docstring)


def decoding(image, sample) -> str:
    """How `image` (a sample, or one of its controls) decodes for 2.1: its decode tag, and whether its alpha is
    kept (its sample's dataset setting decides for its controls too)."""
    kept = keeps_alpha(image.decode, sample.transparency, True)
    return f"{image.decode}; {ALPHA_KEPT}" if kept else image.decode


def text_key(prompt: str, text_fingerprint: str) -> str:
    """Cache key of a prompt embedding: the family (its template is the pipeline's), the encoder, the text."""
    parts = (CACHE_VERSION, NAME, text_fingerprint, prompt)
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def reference_key(control, size: tuple[int, int], vae_fingerprint: str, sample) -> str:
    parts = (CACHE_VERSION, REFERENCE_CACHE_VERSION, NAME, "reference", control.sha256, decoding(control, sample),
             f"{size[0]}x{size[1]}", vae_fingerprint)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def referenced_text_key(prompt: str, controls, sizes: list[tuple[int, int]], text_fingerprint: str, sample) -> str:
    images = [f"{c.sha256}:{decoding(c, sample)}:{w}x{h}" for c, (w, h) in zip(controls, sizes)]
    parts = (CACHE_VERSION, REFERENCE_CACHE_VERSION, NAME, "prompt", text_fingerprint, *images, prompt)
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def references_of(sample) -> tuple:
    """A sample's reference images (an edit sample's controls), () for a text-to-image sample or None."""
    return sample.controls if isinstance(sample, EditSample) else ()


class Conditioning21(CacheConditioning):
    """One cache build's prompts (alone or with references) and reference latents."""

    def __init__(self, components, samples: list, control_resolution: int = 0):
        self.components, self.control_resolution = components, control_resolution
        self.text_fingerprint = components.fingerprint("text_encoder")
        self.vae_fingerprint = components.fingerprint("vae")
        self.sizes = {s.image_path: [check_reference_size(Path(c.path).name, c.width, c.height, control_resolution)
                                     for c in references_of(s)] for s in samples}

    def _sizes(self, sample) -> list[tuple[int, int]]:
        if sample.image_path not in self.sizes:  # a sample of another build (the preview's): sized the same way
            self.sizes[sample.image_path] = [check_reference_size(Path(c.path).name, c.width, c.height,
                                                                  self.control_resolution) for c in sample.controls]
        return self.sizes[sample.image_path]

    def target_key(self, sample, vae_fingerprint: str) -> str:
        kept = f"|{ALPHA_KEPT}" if decoding(sample, sample) != sample.decode else ""
        return hashlib.sha256(f"{latent_key(sample, vae_fingerprint)}|{TARGET_RECIPE}{kept}".encode()).hexdigest()[:32]

    def encode_target(self, sample):
        crop = cropped_image(sample.image_path, sample.bucket, sample.background, sample.allow_large_images,
                             keep_alpha=decoding(sample, sample) != sample.decode)  # RGB, or RGBA with its alpha kept
        w, h = sample.bucket
        pixels = self._vae_pipe().image_processor.preprocess(crop.convert("RGBA"), width=w, height=h)  # (1, 4, H, W)
        return encode_images(self.components.vae, pixels)[0]  # (C, h, w); fp32 on a CPU whatever the VAE's dtype

    def _vae_pipe(self):
        if getattr(self, "_pipe", None) is None:
            self._pipe = reference_pipeline(self.components, encoder=False)
        return self._pipe

    def text_key(self, prompt: str, sample) -> str:
        controls = references_of(sample)
        if not controls:
            return text_key(prompt, self.text_fingerprint)
        return referenced_text_key(prompt, controls, self._sizes(sample), self.text_fingerprint, sample)

    def condition_jobs(self, sample) -> dict:
        return {reference_key(c, z, self.vae_fingerprint, sample): (c, z, sample)
                for c, z in zip(references_of(sample), self._sizes(sample))}

    def entry_fields(self, sample) -> dict:
        controls = references_of(sample)
        if not controls:
            return {}
        sizes = self._sizes(sample)
        return {"condition_keys": tuple(reference_key(c, z, self.vae_fingerprint, sample) for c, z in zip(controls, sizes)),
                "condition_sizes": tuple(sizes), "condition_paths": tuple(c.path for c in controls)}

    def _prepared(self, pipe, control, size, sample):
        image = open_image(Path(control.path), sample.background, sample.allow_large_images,
                           keep_alpha=decoding(control, sample) != control.decode)  # RGB, or RGBA with alpha kept
        return prepare_reference(pipe, image, size)

    def encode_conditions(self, jobs: dict, write) -> None:
        if not jobs:
            return
        pipe = self._vae_pipe()
        for key, (c, size, s) in jobs.items():
            latents = encode_reference_latents(pipe, self._prepared(pipe, c, size, s).pixels,
                                               self.components.compute_dtype)
            write({"latents": latents}, "latents", key, f"reference image {Path(c.path).name}")

    def encode_prompts(self, jobs: dict, write) -> None:
        pipe = None
        for key, (prompt, s) in jobs.items():
            controls = references_of(s)
            what = f"prompt {prompt[:40]!r}"
            if not controls:
                write({"embedding": encode_prompt(self.components.text_encoder, self.components.tokenizer, prompt)},
                      "text", key, what)
                continue
            pipe = pipe or reference_pipeline(self.components)
            prepared = [self._prepared(pipe, c, z, s) for c, z in zip(controls, self._sizes(s))]
            embedding, slots = encode_reference_prompt(pipe, prompt, prepared, self.components.device,
                                                       [Path(c.path).name for c in controls])
            write({"embedding": embedding, "image_slots": slots}, "text", key, what)
