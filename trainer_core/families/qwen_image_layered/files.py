"""Qwen-Image-Layered from ComfyUI's files or a diffusers folder, and how a model set says it is Layered.

The files are the text-to-image layouts (models/transformer_file.py, vae_file.py): ComfyUI's
qwen_image_layered_bf16.safetensors is a Qwen-Image transformer with one more tensor,
`time_text_embed.addition_t_embedding.weight`, from which the transformer loader sets Layered's two flags
(`use_additional_t_cond`, `use_layer3d_rope`; ComfyUI's model_detection reads the same key), and
qwen_image_layered_vae.safetensors is a Wan 2.1 VAE with 4 image channels (RGBA), which the VAE loader reads
from its first convolution. A diffusers Qwen-Image-Layered folder says both in its configs.

The loaders of models/ know no families; `recognise` gives a loaded model set Layered's family when its
transformer is Layered's, and refuses a VAE of the other kind by its file's name.
"""

from __future__ import annotations

from ...core.errors import UserInputError
from .family import QWEN_IMAGE_LAYERED
from .tiny import RGBA


def is_layered(components) -> bool:
    return bool(components.skeleton().config.get("use_additional_t_cond"))


def _vae_channels(components) -> tuple[int, str]:
    """(image channels of the model set's VAE, its name for messages), without loading its weights."""
    if components.vae is not None:
        return components.vae.config.input_channels, "the VAE"
    source = components.vae_loader
    return source.config.get("input_channels", 3), f"VAE file {source.file.path}"


def recognise(components):
    """`components` with the Layered family when its transformer is Layered's; its VAE must fit."""
    layered = is_layered(components)
    channels, vae = _vae_channels(components)
    if layered and channels != RGBA:
        raise UserInputError(f"the transformer is Qwen-Image-Layered, but {vae} takes {channels}-channel images, not "
                             "RGBA: choose qwen_image_layered_vae.safetensors (Layered's own VAE).")
    if not layered and channels == RGBA:
        raise UserInputError(f"{vae} is Qwen-Image-Layered's RGBA VAE, but the transformer is not Layered: choose "
                             "qwen_image_vae.safetensors, or the Layered transformer "
                             "qwen_image_layered_bf16.safetensors.")
    if layered:
        components.family = QWEN_IMAGE_LAYERED
    return components


def load_layered_single_files(transformer, text_encoder, vae, tokenizer_dir=None, storage: str = "float8",
                              compute_dtype=None, device="cpu", text_encoder_fp8: str = "dequantize"):
    """A lazy Layered model set from three files (as single_file.load_single_files); refused by name when the
    transformer is not Layered's. `text_encoder_fp8` may be 'auto' (`planner.resolve_text_encoder_fp8`)."""
    import torch

    from ...models.single_file import load_single_files
    from ...planner.device import CachingPlacement, resolve_text_encoder_fp8

    fp8 = resolve_text_encoder_fp8(text_encoder_fp8, device)
    components = recognise(load_single_files(transformer, text_encoder, vae, tokenizer_dir, storage,
                                             compute_dtype or torch.bfloat16, device, fp8))
    components.text_encoder_placement = CachingPlacement(components, one_byte=fp8 == "keep")
    if components.family is not QWEN_IMAGE_LAYERED:
        raise UserInputError(f"transformer file {transformer} is not Qwen-Image-Layered (it has no "
                             "time_text_embed.addition_t_embedding): choose qwen_image_layered_bf16.safetensors.")
    return components
