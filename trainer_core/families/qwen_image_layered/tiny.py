"""A tiny Qwen-Image-Layered model set with random weights: the real classes, configs small enough for a CPU.

The transformer is the tiny text-to-image one (`models.tiny.TINY_TRANSFORMER`) with Layered's two flags
(`use_additional_t_cond`: the timestep embedding adds `addition_t_embedding`; `use_layer3d_rope`: RoPE with a
frame axis, the composite and layers at frames 0..F-1 and the condition image at -1). The VAE takes and
makes RGBA (`input_channels=4`) and downsamples 8x as the real one does (the pipeline derives its latent
sizes from the VAE's factor). The text encoder and
tokenizer are the text-to-image ones (Layered's prompts are text only).
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

from ...models.components import QwenImageComponents
from ...models.float8 import store_block_linears
from ...models.qwen_arch import PATCH_SIZE
from ...models.tiny import TINY_TRANSFORMER, build_tiny_components
from ..registry import get_family

LAYERED_FLAGS = {"use_additional_t_cond": True, "use_layer3d_rope": True}
RGBA = 4
# Not 4 latent channels: the pipeline takes an `image` with as many channels as the latents for latents.
TINY_LAYERED_LATENT_CHANNELS = 8
TINY_LAYERED_TRANSFORMER = {**TINY_TRANSFORMER, **LAYERED_FLAGS, "out_channels": TINY_LAYERED_LATENT_CHANNELS,
                            "in_channels": PATCH_SIZE**2 * TINY_LAYERED_LATENT_CHANNELS}
TINY_LAYERED_VAE = dict(
    base_dim=8, z_dim=TINY_LAYERED_LATENT_CHANNELS, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
    temperal_downsample=[False, True, True], input_channels=RGBA,
    latents_mean=[0.0] * TINY_LAYERED_LATENT_CHANNELS, latents_std=[1.0] * TINY_LAYERED_LATENT_CHANNELS,
)


def build_tiny_layered_components(seed: int = 0, storage: str = "float32", compute_dtype: torch.dtype = torch.float32,
                                  device: str | torch.device = "cpu") -> QwenImageComponents:
    """The tiny Qwen-Image-Layered model set (`build_tiny_layered_model_set`)."""
    return build_tiny_layered_model_set(get_family("qwen-image-layered"), seed, storage, compute_dtype, device)


def build_tiny_layered_model_set(family, seed: int = 0, storage: str = "float32",
                                 compute_dtype: torch.dtype = torch.float32,
                                 device: str | torch.device = "cpu") -> QwenImageComponents:
    """Tiny Layered transformer + RGBA VAE + text encoder + tokenizer, random weights from `seed`, of `family`."""
    components = build_tiny_components(seed=seed, storage="float32", compute_dtype=compute_dtype, device=device,
                                       family=family)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 10)
        transformer = QwenImageTransformer2DModel(**TINY_LAYERED_TRANSFORMER)
        torch.manual_seed(seed + 11)
        vae = AutoencoderKLQwenImage(**TINY_LAYERED_VAE)
    components.transformer = transformer.to(compute_dtype).requires_grad_(False).eval()
    store_block_linears(components.transformer, storage)
    components.vae = vae.to(compute_dtype).to(torch.device(device)).requires_grad_(False).eval()
    components.storage = storage
    components.name = f"tiny-qwen-image-layered-seed{seed}"
    return components
