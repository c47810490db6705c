"""The Edit family's loaders: Qwen-Image-Edit from ComfyUI's single files or a diffusers folder (the variant,
the transformer, Edit-2511's with `zero_cond_t`, and the text encoder with its vision tower); the model set
they return carries the variant's family.

The files are the text-to-image ones' layouts (models/transformer_file.py, text_encoder_file.py, vae_file.py) with two
differences: an Edit-2511 transformer file carries ComfyUI's marker key `__index_timestep_zero__` (read by
variants.py, skipped as a tensor), and the text encoder is loaded with `visual.*` (ComfyUI's
qwen_2.5_vl_7b_fp8_scaled file has it). A diffusers Edit folder loads as a text-to-image one does (its
text_encoder/ has the vision tower and its transformer config says `zero_cond_t`); its variant comes from
that config and model_index.json.

`load` is this package's answer to the Load Edit node's request (families/loading.py): asked after the packages that
recognise their own files (Qwen-Image 2.1's), it takes every other Load Edit request.
"""

from __future__ import annotations

import json

from pathlib import Path

import torch

from ...core.errors import UserInputError
from ...models.components import QwenImageComponents
from ...models.diffusers_dir import load_diffusers_dir
from ...models.safetensors_file import SafetensorsFile
from ...models.single_file import load_single_files
from ...models.source import DIFFUSERS, FILES, SHAPES, TINY
from ...planner.device import CachingPlacement, resolve_text_encoder_fp8
from ..registry import get_family
from .tiny import build_tiny_edit_components
from .variants import AUTO, ZERO_COND_MARKER, resolve_variant, variant_from_diffusers_dir, variant_from_file

TINY_AUTO_VARIANT = "edit-2511"  # the tiny Edit model an 'auto' variant builds (the Load Edit node's too)


def _choice(variant: str) -> str:
    return AUTO if variant in (AUTO, "edit-auto") else variant


def load_edit_single_files(
    transformer: str | Path,
    text_encoder: str | Path,
    vae: str | Path,
    tokenizer_dir: str | Path | None = None,
    storage: str = "float8",
    compute_dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    text_encoder_fp8: str = "dequantize",
    variant: str = AUTO,
) -> QwenImageComponents:
    """A lazy edit model set from three files and a tokenizer folder (as single_file.load_single_files).
    `variant`: 'auto' (read from the transformer file) or one of variants.EDIT_VARIANTS. `text_encoder_fp8` may
    be the Load settings' 'auto', decided here for `device` (`planner.resolve_text_encoder_fp8`)."""
    edit = resolve_variant(_choice(variant), variant_from_file(transformer, SafetensorsFile(transformer, "transformer").keys))
    fp8 = resolve_text_encoder_fp8(text_encoder_fp8, device)
    components = load_single_files(transformer, text_encoder, vae, tokenizer_dir, storage, compute_dtype, device, fp8,
                                   vision=True, extra_config={"zero_cond_t": edit.zero_cond_t},
                                   family=get_family(edit.name))
    components.text_encoder_placement = CachingPlacement(components, one_byte=fp8 == "keep")
    return components


def load_edit_diffusers_dir(path: str | Path, storage: str = "float8", compute_dtype: torch.dtype = torch.bfloat16,
                            device: str | torch.device = "cpu", variant: str = AUTO) -> QwenImageComponents:
    """An edit model set from a diffusers Qwen-Image-Edit folder (as diffusers_dir.load_diffusers_dir)."""
    edit = resolve_variant(_choice(variant), variant_from_diffusers_dir(path))
    return load_diffusers_dir(path, storage, compute_dtype, device, family=get_family(edit.name))


# The members' names as users know them (comfyui_files.py's), by variant.
MEMBERS = {"edit": "Qwen-Image-Edit", "edit-2509": "Qwen-Image-Edit-2509", "edit-2511": "Qwen-Image-Edit-2511"}


def edit_member(request) -> str | None:
    """The Qwen-Image-Edit member a request's transformer file or diffusers folder is, where it tells (2511 by its
    marker key or config, any variant by a folder's pipeline class or by a file name ComfyUI ships), else None."""
    from ...models.safetensors_file import holds_key
    from ..comfyui_files import EDIT, known_file

    if request.source == FILES and request.transformer is not None:
        if holds_key(request.transformer, ZERO_COND_MARKER):
            return MEMBERS["edit-2511"]
        known = known_file(request.transformer.name)
        return known.member if known is not None and known.family == EDIT else None
    if request.source == DIFFUSERS and request.diffusers_folder:
        root = Path(request.diffusers_folder)
        try:
            index = json.loads((root / "model_index.json").read_text())
            config = json.loads((root / "transformer" / "config.json").read_text())
        except (OSError, ValueError):
            return None
        if not (isinstance(index, dict) and isinstance(config, dict)):
            return None
        if config.get("zero_cond_t"):
            return MEMBERS["edit-2511"]
        return {"QwenImageEditPipeline": MEMBERS["edit"], "QwenImageEditPlusPipeline": MEMBERS["edit-2509"]}.get(
            index.get("_class_name"))
    return None


def misplaced(request) -> str | None:
    """A text-to-image Load request (the Load node, a run file without [edit]) naming an Edit model: trained there it
    would be plain Qwen-Image, without the control images it edits from (and 2511 without its timestep-0 controls)."""
    if request.edit:
        return None
    member = edit_member(request)
    if member is None:
        return None
    what = (f"transformer file {request.transformer}" if request.source == FILES
            else f"diffusers folder {request.diffusers_folder}")
    return (f"{what} is {member}, an edit model, but it was loaded by the text-to-image Load node (Load Qwen-Image; a "
            "run file without [edit]), which would train it as plain Qwen-Image, without the control images it edits "
            "from. Load it with the Load Qwen-Image-Edit node and an Edit Dataset (in a run file, add an [edit] "
            "table); to train text-to-image, choose a Qwen-Image transformer such as qwen_image_fp8_e4m3fn.safetensors.")


def load(request) -> QwenImageComponents | None:
    """The Load Edit node's model set (a run file's [model] with [edit]): the tiny test model as the chosen variant
    (auto: Edit-2511), a diffusers Edit folder, or three files; None for the Load node's request."""
    if not request.edit:
        return None
    device, dtype, variant = request.device, request.dtype, request.edit_variant
    if request.source == TINY:
        return build_tiny_edit_components(TINY_AUTO_VARIANT if _choice(variant) == AUTO else variant,
                                          storage=request.storage, compute_dtype=dtype, device=device)
    if request.source == SHAPES:
        raise UserInputError("an edit run needs a Qwen-Image-Edit model, and the shapes model is a text-to-image one: "
                             "choose the tiny test model (the tiny Edit model), an Edit diffusers folder or Edit model "
                             "files; in a run file, set [model] source = \"tiny\" or remove [edit].")
    if request.source == DIFFUSERS:
        if not request.diffusers_folder:
            raise UserInputError("diffusers_folder is empty: enter the path of a diffusers Qwen-Image-Edit folder.")
        return load_edit_diffusers_dir(request.diffusers_folder, storage=request.storage, compute_dtype=dtype,
                                       device=device, variant=variant)
    assert request.source == FILES
    request.require("transformer", "text_encoder", "vae", hint="Qwen-Image-Edit reads qwen_image_edit_*, "
                    "qwen_2.5_vl_7b_fp8_scaled (with its vision tower) and qwen_image_vae")
    return load_edit_single_files(request.transformer, request.text_encoder, request.vae,
                                  tokenizer_dir=request.tokenizer, storage=request.storage, compute_dtype=dtype,
                                  device=device, text_encoder_fp8=request.text_encoder_fp8, variant=variant)
