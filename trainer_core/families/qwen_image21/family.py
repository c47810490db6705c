"""Qwen-Image 2.1 as a model family: what differs from Qwen-Image, behind the seam's hooks.

A sample is a target image and its caption (text-to-image; reference images are not trained yet). What the
pinned `QwenImage21Pipeline` feeds its transformer, and so what training feeds it (objective.py):
    hidden_states          the noisy target latents unpacked, one token per latent cell (B, N = h * w, C)
    encoder_hidden_states  the prompt's Qwen3-VL embedding (B, L, D) (text.py), right-padded with its mask
    img_mask               (B, L + N / 4): False over the text, True over the target's slots (one per 2 x 2 cells)
    img_shapes             [[(1, h, w)]] per sample; timestep: the noise level s in (0, 1) (the pipeline's t / 1000)
The output covers the whole joint sequence; the loss takes its last N rows, as the pipeline's prediction.

Tensors: latents (C = 64, h, w) per sample (16x VAE: h = H / 16); prompt embeddings (L, D = 4096).
"""

from __future__ import annotations

import hashlib

from ...core.errors import UserInputError
from ..base import CacheConditioning, DemoSpec, ModelFamily
from ..qwen_image import PromptsOnly

NAME = "qwen-image-2.1"


def text_key(prompt: str, text_fingerprint: str) -> str:
    """Cache key of a prompt embedding: the family (its template is the pipeline's), the encoder, the text."""
    from ...data.cache import CACHE_VERSION

    parts = (CACHE_VERSION, NAME, text_fingerprint, prompt)
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


class _Prompts(PromptsOnly):
    """Text-to-image caching: each prompt encoded alone by the pipeline's method; no condition latents."""

    def text_key(self, prompt: str, sample) -> str:
        return text_key(prompt, self.text_fingerprint)

    def encode_one(self, prompt: str):
        from .text import encode_prompt

        return encode_prompt(self.components.text_encoder, self.components.tokenizer, prompt)  # (L, D)


class QwenImage21(ModelFamily):
    name = NAME
    patch_size = 1  # the transformer takes latent cells unpacked (its config's patch_size 1)

    # data and cache

    def check_samples(self, samples) -> None:
        from ..qwen_image_edit.data import EditSample

        if any(isinstance(s, EditSample) for s in samples):
            raise UserInputError("the loaded model is Qwen-Image 2.1, which trains on text-to-image datasets here (its "
                                 "reference images are not trained yet): use the Dataset node, not Edit Dataset.")

    def cache_conditioning(self, components, samples, settings) -> CacheConditioning:
        self.check_samples(samples)
        return _Prompts(components)

    # training step

    def transformer_kwargs(self, hidden, grid, conditions, text, text_mask, text_keys=None, dataset=None):
        from .objective import transformer_kwargs

        return transformer_kwargs(hidden, grid, text, text_mask)

    def target_prediction(self, output, grid):
        return output[:, -grid[0] * grid[1]:]  # the target's tokens close the joint sequence

    # previews

    def preview_inputs(self, components, dataset, prompts, condition_images):
        from ..sampling import prompt_embedding

        if condition_images:
            raise UserInputError("reference images were connected to Preview, but Qwen-Image 2.1 previews are "
                                 "text-to-image here: disconnect them.")
        return None, {p: prompt_embedding(dataset, p) for p in dict.fromkeys(prompts)}

    def preview_pipeline(self, components, conditions):
        from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline

        processor = components.tokenizer if components.tokenizer is not None else components.processor_loader()
        return QwenImage21Pipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config),
                                   vae=components.vae, text_encoder=None, processor=processor,
                                   transformer=components.transformer)

    # built-ins

    def tiny_components(self, seed=0, storage="float32", compute_dtype=None, device="cpu"):
        import torch

        from .tiny import build_tiny_qwen_image21

        return build_tiny_qwen_image21(seed=seed, storage=storage, compute_dtype=compute_dtype or torch.float32,
                                       device=device)

    def demo(self) -> DemoSpec:
        from ..qwen_image import PREVIEW_PROMPT, _demo_samples

        return DemoSpec(run_name="demo-qwen-image-2.1", lora_name="demo_qwen_image21_lora.safetensors",
                        preview_prompt=PREVIEW_PROMPT, plot_title="qwen-image-2.1 demo loss",
                        make_dataset=_demo_samples)


QWEN_IMAGE21 = QwenImage21()
