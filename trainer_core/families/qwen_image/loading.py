"""Text-to-image Qwen-Image model sets: models/'s loaders (which know no family), with this family handed to them,
and the package's `load` (families/loading.py): the Load node's request when no other family's package took it.

The text encoder's fp8 'auto' is decided here, for the device, before anything takes its memory
(`planner.resolve_text_encoder_fp8`); a Qwen-Image-Layered RGBA VAE beside a text-to-image transformer is refused by
name (the Layered package takes Layered transformers before this one is asked).
"""

from __future__ import annotations

import torch

from ...core.errors import UserInputError
from ...models import diffusers_dir, pretrained, single_file, tiny
from ...models.source import DIFFUSERS, FILES, SHAPES, TINY
from ...planner.device import CachingPlacement, resolve_text_encoder_fp8
from .family import QWEN_IMAGE

RGBA = 4  # image channels of Qwen-Image-Layered's VAE


def build_tiny_components(seed: int = 0, storage: str = "float32", compute_dtype: torch.dtype = torch.float32,
                          device: str | torch.device = "cpu"):
    """The tiny text-to-image model set (`models.tiny.build_tiny_components`)."""
    return tiny.build_tiny_components(seed, storage, compute_dtype, device, family=QWEN_IMAGE)


def load_single_files(transformer, text_encoder, vae, tokenizer_dir=None, storage: str = "float8",
                      compute_dtype=None, device="cpu", text_encoder_fp8: str = "auto", **kwargs):
    """`models.single_file.load_single_files`, of this family; `text_encoder_fp8` may be the Load settings'
    'auto', decided here for `device` (`planner.resolve_text_encoder_fp8`) before anything takes its memory."""
    fp8 = resolve_text_encoder_fp8(text_encoder_fp8, device)
    components = single_file.load_single_files(transformer, text_encoder, vae, tokenizer_dir, storage,
                                               compute_dtype or torch.bfloat16, device, fp8, family=QWEN_IMAGE,
                                               **kwargs)
    components.text_encoder_placement = CachingPlacement(components, one_byte=fp8 == "keep")
    return refuse_rgba_vae(components)


def load_diffusers_dir(path, storage: str = "float8", compute_dtype: torch.dtype = torch.bfloat16, device="cpu"):
    """`models.diffusers_dir.load_diffusers_dir`, of this family."""
    return refuse_rgba_vae(diffusers_dir.load_diffusers_dir(path, storage, compute_dtype, device, family=QWEN_IMAGE))


def load_shapes_model(storage: str = "float8", compute_dtype: torch.dtype = torch.float32, device="cpu", **kwargs):
    """`models.pretrained.load_shapes_model` (the shipped small model), of this family."""
    return pretrained.load_shapes_model(storage, compute_dtype, device, family=QWEN_IMAGE, **kwargs)


def refuse_rgba_vae(components):
    channels, vae = components.vae_image_channels()
    if channels == RGBA:
        raise UserInputError(f"{vae} is Qwen-Image-Layered's RGBA VAE, but the transformer is not Layered: choose "
                             "qwen_image_vae.safetensors, or the Layered transformer "
                             "qwen_image_layered_bf16.safetensors.")
    return components


def _pipeline_class(folder: str) -> str | None:
    """The pipeline class a diffusers folder's model_index.json names, or None."""
    import json
    from pathlib import Path

    try:
        index = json.loads((Path(folder) / "model_index.json").read_text()) if folder else None
    except (OSError, ValueError):
        return None
    return index.get("_class_name") if isinstance(index, dict) else None


def misplaced(request) -> str | None:
    """A Load Edit request (a run file with [edit]) naming a text-to-image Qwen-Image transformer by a name ComfyUI
    ships it under: its tensors are an Edit transformer's, so it would load, and train edits on a model that never
    learnt to edit (the marker of an Edit-2511 file, renamed, wins over its name)."""
    from ...models.layouts import EDIT_2511_MARKER
    from ...models.safetensors_file import holds_key
    from ..comfyui_files import QWEN_IMAGE as TEXT_TO_IMAGE, known_file

    if not request.edit:
        return None
    if request.source == DIFFUSERS and _pipeline_class(request.diffusers_folder) == "QwenImagePipeline":
        return (f"diffusers folder {request.diffusers_folder} is text-to-image Qwen-Image (its model_index.json names "
                "QwenImagePipeline), but it was loaded by the Load Qwen-Image-Edit node (a run file with [edit]), which "
                "trains edits from control images. Choose a Qwen-Image-Edit folder, or load this one with the Load "
                "Qwen-Image node (in a run file, remove the [edit] table).")
    if request.source != FILES or request.transformer is None:
        return None
    known = known_file(request.transformer.name)
    if known is None or known.family != TEXT_TO_IMAGE or known.folder != "diffusion_models":
        return None
    if holds_key(request.transformer, EDIT_2511_MARKER):
        return None
    return (f"transformer file {request.transformer} is {known.member}, a text-to-image model, but it was loaded by "
            "the Load Qwen-Image-Edit node (a run file with [edit]), which trains edits from control images. Choose a "
            "Qwen-Image-Edit transformer (qwen_image_edit_2511_bf16.safetensors, ..._fp8mixed or ..._int8_convrot), or "
            "load this one with the Load Qwen-Image node (in a run file, remove the [edit] table).")


def load(request):
    """The Load node's model set as text-to-image Qwen-Image: asked last (families/loading.py), so it takes what no
    other family's package recognised; a Load Edit request is Qwen-Image-Edit's, not this package's."""
    if request.edit:
        return None
    device, dtype = request.device, request.dtype
    if request.source == TINY:
        return build_tiny_components(seed=0, storage=request.storage, compute_dtype=dtype, device=device)
    if request.source == SHAPES:
        return load_shapes_model(storage=request.storage, compute_dtype=dtype, device=device)
    if request.source == DIFFUSERS:
        if not request.diffusers_folder:
            raise UserInputError("diffusers_folder is empty: enter the path of a diffusers Qwen-Image folder.")
        return load_diffusers_dir(request.diffusers_folder, storage=request.storage, compute_dtype=dtype, device=device)
    assert request.source == FILES
    request.require("transformer", "text_encoder", "vae",
                    hint="Qwen-Image reads qwen_image_*, qwen_2.5_vl_7b_fp8_scaled and qwen_image_vae")
    return load_single_files(request.transformer, request.text_encoder, request.vae, tokenizer_dir=request.tokenizer,
                             storage=request.storage, compute_dtype=dtype, device=device,
                             text_encoder_fp8=request.text_encoder_fp8)
