"""The Layered family's part of the shared cache (`cache.build_cache`): the composite and its layers as one
target entry, and text-only prompts, on disk by content.

Keys:
- the target latents (C, F, h, w), F = layers + 1: the composite's and every layer's bytes in order, the
  bucket, the crop recipe, the VAE's identity;
- a prompt embedding: the prompt, the Layered pipeline's template and token limit, the text encoder's
  identity (tokenizer included). The prompt does not see the images, so one key serves every sample.

The condition the transformer sees (the composite's clean latents) is frame 0 of the target entry: the
same pixels encoded the same way, so it is not encoded twice (`family.conditions` reads it there). Every
frame and every prompt is encoded alone, as in cache.py.
"""

from __future__ import annotations

import hashlib

from ...data.cache import CACHE_VERSION, CROP_RECIPE
from ..base import CacheConditioning
from .data import LayeredSample, crop_rgba, open_rgba
from .pipeline import encode_frames, encode_prompt, layered_pipeline, max_sequence_length, prompt_template

# Bump when the way Layered targets or prompts are made changes.
LAYERED_CACHE_VERSION = "1"


def layered_target_key(sample: LayeredSample, vae_fingerprint: str) -> str:
    parts = (CACHE_VERSION, LAYERED_CACHE_VERSION, "layered-target", CROP_RECIPE, sample.image_sha256,
             *(layer.sha256 for layer in sample.layers), f"{sample.bucket[0]}x{sample.bucket[1]}", vae_fingerprint)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def layered_text_key(prompt: str, text_fingerprint: str) -> str:
    parts = (CACHE_VERSION, LAYERED_CACHE_VERSION, "layered-prompt", prompt_template(), str(max_sequence_length()),
             text_fingerprint, prompt)
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def sample_frames(sample: LayeredSample) -> list:
    """The composite and its layers as RGBA PIL images cropped to the sample's bucket."""
    paths = [sample.image_path, *(layer.path for layer in sample.layers)]
    return [crop_rgba(open_rgba(p), sample.bucket) for p in paths]


class LayeredConditioning(CacheConditioning):
    def __init__(self, components):
        self.components = components
        self.text_fingerprint = components.fingerprint("text_encoder")

    def target_key(self, sample: LayeredSample, vae_fingerprint: str) -> str:
        return layered_target_key(sample, vae_fingerprint)

    def encode_target(self, sample: LayeredSample):
        pipe = layered_pipeline(self.components, encoder=False)
        return encode_frames(pipe, sample_frames(sample), self.components.compute_dtype)  # (C, F, h, w)

    def text_key(self, prompt: str, sample) -> str:
        return layered_text_key(prompt, self.text_fingerprint)

    def entry_fields(self, sample: LayeredSample) -> dict:
        """The layers' files (`condition_paths`: status text; their count groups micro-batches)."""
        return {"condition_paths": tuple(layer.path for layer in sample.layers),
                "condition_sizes": (sample.bucket,)}

    def encode_prompts(self, jobs: dict, write) -> None:
        pipe = layered_pipeline(self.components)
        for key, (prompt, _sample) in jobs.items():
            write({"embedding": encode_prompt(pipe, prompt, self.components.device)}, "text", key,
                  f"prompt {prompt[:40]!r}")


def layer_count(cached_sample) -> int:
    return len(cached_sample.condition_paths)
