"""Qwen-Image-Layered from ComfyUI's files or a diffusers folder, and how its files say they are Layered.

The files are the text-to-image layouts (models/transformer_file.py, vae_file.py): ComfyUI's
qwen_image_layered_bf16.safetensors is a Qwen-Image transformer with one more tensor,
`time_text_embed.addition_t_embedding.weight` (`LAYERED_PROBE`), from which the transformer loader sets Layered's
two flags (`use_additional_t_cond`, `use_layer3d_rope`; ComfyUI's model_detection reads the same key), and
qwen_image_layered_vae.safetensors is a Wan 2.1 VAE with 4 image channels (RGBA), which the VAE loader reads
from its first convolution. A diffusers Qwen-Image-Layered folder says both in its configs.

`load` is this package's answer to the Load node's request (families/loading.py): a Layered transformer file or
folder, with a VAE of the right kind, refused by name otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...core.errors import UserInputError
from ...models.diffusers_dir import load_diffusers_dir
from ...models.safetensors_file import holds_key
from ...models.single_file import load_single_files
from ...models.source import DIFFUSERS, FILES
from ...planner.device import CachingPlacement, resolve_text_encoder_fp8
from .family import QWEN_IMAGE_LAYERED
from .tiny import RGBA

LAYERED_PROBE = "time_text_embed.addition_t_embedding.weight"


def is_layered_file(path) -> bool:
    """Whether the transformer file at `path` is Qwen-Image-Layered's (its header: `LAYERED_PROBE`)."""
    return holds_key(path, LAYERED_PROBE)


def is_layered_folder(folder) -> bool:
    try:
        config = json.loads((Path(folder) / "transformer" / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return False
    return bool(isinstance(config, dict) and config.get("use_additional_t_cond"))


def _check_vae(components):
    channels, vae = components.vae_image_channels()
    if channels != RGBA:
        raise UserInputError(f"the transformer is Qwen-Image-Layered, but {vae} takes {channels}-channel images, not "
                             "RGBA: choose qwen_image_layered_vae.safetensors (Layered's own VAE).")
    return components


def load_layered_single_files(transformer, text_encoder, vae, tokenizer_dir=None, storage: str = "float8",
                              compute_dtype=None, device="cpu", text_encoder_fp8: str = "dequantize"):
    """A lazy Layered model set from three files (as single_file.load_single_files); refused by name when the
    transformer is not Layered's. `text_encoder_fp8` may be 'auto' (`planner.resolve_text_encoder_fp8`)."""
    if not is_layered_file(transformer):
        raise UserInputError(f"transformer file {transformer} is not Qwen-Image-Layered (it has no "
                             f"{LAYERED_PROBE.removesuffix('.weight')}): choose qwen_image_layered_bf16.safetensors.")
    fp8 = resolve_text_encoder_fp8(text_encoder_fp8, device)
    components = load_single_files(transformer, text_encoder, vae, tokenizer_dir, storage,
                                   compute_dtype or torch.bfloat16, device, fp8, family=QWEN_IMAGE_LAYERED)
    components.text_encoder_placement = CachingPlacement(components, one_byte=fp8 == "keep")
    return _check_vae(components)


def misplaced(request) -> str | None:
    """A Load Edit request (a run file with [edit]) naming a Layered model: the edit loaders would read it as an Edit
    transformer, its layer decomposition lost."""
    if not request.edit:
        return None
    if request.source == FILES and is_layered_file(request.transformer):
        what = f"transformer file {request.transformer}"
    elif request.source == DIFFUSERS and is_layered_folder(request.diffusers_folder):
        what = f"diffusers folder {request.diffusers_folder}"
    else:
        return None
    return (f"{what} is Qwen-Image-Layered (its {LAYERED_PROBE.removesuffix('.weight')}), but it was loaded by the Load "
            "Qwen-Image-Edit node (a run file with [edit]), which trains edit models. Load it with the Load Qwen-Image "
            "node and a Layered dataset (in a run file, remove the [edit] table); to train an edit LoRA, choose a "
            "Qwen-Image-Edit transformer such as qwen_image_edit_2511_bf16.safetensors.")


def load(request):
    """The Load node's request when it names a Layered transformer file or diffusers folder, else None."""
    if request.edit:
        return None
    if request.source == FILES and is_layered_file(request.transformer):
        request.require("text_encoder", "vae", hint="Layered reads qwen_2.5_vl_7b_fp8_scaled and qwen_image_layered_vae")
        return load_layered_single_files(request.transformer, request.text_encoder, request.vae, request.tokenizer,
                                         request.storage, request.dtype, request.device, request.text_encoder_fp8)
    if request.source == DIFFUSERS and is_layered_folder(request.diffusers_folder):
        return _check_vae(load_diffusers_dir(request.diffusers_folder, request.storage, request.dtype, request.device,
                                             family=QWEN_IMAGE_LAYERED))
    return None
