"""Tiny Qwen-Image-Edit model sets with random weights: the real classes, configs small enough for a CPU.

The same tiny parts as text-to-image (`models.tiny`): the transformer of the variant (Edit-2511's with
`zero_cond_t`, which adds no tensors), the VAE, and the tiny Qwen2.5-VL, whose vision tower (depth 1,
width 16, Qwen's patch 14 / merge 2 / temporal patch 2) the edit prompts use. A tiny control image costs
little: `control_resolution` (edit data) keeps the control sizes small.
"""

from __future__ import annotations

import torch
from diffusers import QwenImageTransformer2DModel

from ...models.components import QwenImageComponents
from ...models.float8 import store_block_linears
from ...models.tiny import TINY_TRANSFORMER, build_tiny_components
from ..registry import get_family
from .variants import get_variant


def tiny_edit_transformer_config(variant: str) -> dict:
    return {**TINY_TRANSFORMER, "zero_cond_t": get_variant(variant).zero_cond_t}


def build_tiny_edit_components(
    variant: str = "edit-2511",
    seed: int = 0,
    storage: str = "float32",
    compute_dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> QwenImageComponents:
    """The tiny model set of the Edit variant named `variant` (`build_tiny_edit_model_set`)."""
    return build_tiny_edit_model_set(get_family(get_variant(variant).name), seed, storage, compute_dtype, device)


def build_tiny_edit_model_set(family, seed: int = 0, storage: str = "float32",
                              compute_dtype: torch.dtype = torch.float32,
                              device: str | torch.device = "cpu") -> QwenImageComponents:
    """Tiny Edit transformer (of `family`'s variant) + VAE + text encoder with vision tower + tokenizer, of `family`.

    The weights equal `models.tiny.build_tiny_components(seed)`'s: only the transformer's config differs."""
    variant = family.variant.name
    components = build_tiny_components(seed=seed, storage="float32", compute_dtype=compute_dtype, device=device,
                                       family=family)
    if family.variant.zero_cond_t:
        transformer = QwenImageTransformer2DModel(**tiny_edit_transformer_config(variant)).to(compute_dtype)
        transformer.load_state_dict(components.transformer.state_dict())
        components.transformer = transformer.requires_grad_(False).eval()
    store_block_linears(components.transformer, storage)
    components.storage = storage
    components.name = f"tiny-qwen-image-{variant}-seed{seed}"
    return components
