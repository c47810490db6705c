"""Qwen-Image text-to-image (and Qwen-Image-2512, the same architecture): the first instance of the family seam.

A sample is a target image and its caption; nothing else conditions it. The prompt is encoded alone with
the text-to-image pipeline's template (models/text.py), the transformer sees the target's tokens only and
the loss covers all of them.

Tensors: latents (C, h, w); packed tokens (B, N = h/2 * w/2, 4C); prompt embeddings (L, D).
"""

from __future__ import annotations

import hashlib

import torch

from ...data import cache
from ...data.demo_shapes import PREVIEW_PROMPT, demo_samples
from ...models.diffusers_dir import save_diffusers_dir
from ...models.part_files import check_layout, export_comfyui_files
from ...models.text import encode_prompts, pipeline_prompt_constants
from ...models.tiny import build_tiny_components
from ..base import IMAGES, CacheConditioning, DemoSpec, ModelFamily

# What export-tiny names the tiny model's files by (qwen_image_<stem>_bf16.safetensors): Qwen-Image-2512 has Qwen-Image's
# architecture and tensor names, new weights only, so its files differ by their names (ComfyUI's 0.33.0 template's).
EXPORT_STEMS = {"qwen-image": "tiny", "qwen-image-2512": "2512_tiny"}


def text_key(prompt: str, text_fingerprint: str) -> str:
    """Cache key of a prompt embedding: the text, the encoder's identity (tokenizer included), the template."""
    template, max_tokens = pipeline_prompt_constants()
    parts = (cache.CACHE_VERSION, template, str(max_tokens), text_fingerprint, prompt)
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


class PromptsOnly(CacheConditioning):
    """Text-to-image caching: each prompt encoded alone, whatever sample it belongs to; no condition latents.
    A text-to-image family with another encoder (Qwen-Image 2.1) changes `text_key` and `encode_one`."""

    def __init__(self, components):
        self.components = components
        self.text_fingerprint = components.fingerprint("text_encoder")

    def text_key(self, prompt: str, sample) -> str:
        return text_key(prompt, self.text_fingerprint)

    def encode_one(self, prompt: str):
        """The prompt's embedding (L, D)."""
        return encode_prompts(self.components.text_encoder, self.components.tokenizer, [prompt])[0]

    def encode_prompts(self, jobs, write) -> None:
        for key, (prompt, _sample) in jobs.items():
            write({"embedding": self.encode_one(prompt)}, "text", key, f"prompt {prompt[:40]!r}")


class QwenImage(ModelFamily):
    name = "qwen-image"
    display_name = "Qwen-Image"
    dataset_kinds = (IMAGES,)

    def cache_conditioning(self, components, samples, settings) -> CacheConditioning:
        self.check_samples(samples)
        return PromptsOnly(components)

    def tiny_components(self, seed=0, storage="float32", compute_dtype=None, device="cpu"):
        return build_tiny_components(seed, storage, compute_dtype or torch.float32, device, family=self)

    def demo(self) -> DemoSpec:
        return DemoSpec(run_name="demo", lora_name="demo_lora.safetensors", preview_prompt=PREVIEW_PROMPT,
                        plot_title="demo loss", make_dataset=demo_samples)

    def export_tiny(self, folder, layout="comfyui", seed=0, name=None):
        check_layout(layout)
        components = self.tiny_components(seed=seed)
        if layout == "diffusers":
            return {"diffusers_folder": save_diffusers_dir(components, folder)}
        return export_comfyui_files(components, folder, stem=EXPORT_STEMS[name or self.name])


QWEN_IMAGE = QwenImage()
