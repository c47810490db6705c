"""The Edit family's loaders: Qwen-Image-Edit from ComfyUI's single files or a diffusers folder (the variant,
the transformer, Edit-2511's with `zero_cond_t`, and the text encoder with its vision tower); the model set
they return carries the variant's family.

The files are the text-to-image ones' layouts (models/transformer_file.py, text_encoder_file.py, vae_file.py) with two
differences: an Edit-2511 transformer file carries ComfyUI's marker key `__index_timestep_zero__` (read by
variants.py, skipped as a tensor), and the text encoder is loaded with `visual.*` (ComfyUI's
qwen_2.5_vl_7b_fp8_scaled file has it). A diffusers Edit folder loads as a text-to-image one does (its
text_encoder/ has the vision tower and its transformer config says `zero_cond_t`); its variant comes from
that config and model_index.json.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...core.errors import UserInputError
from ...models.components import QwenImageComponents
from ...models.safetensors_file import SafetensorsFile
from ...models.single_file import load_single_files
from ...planner.device import CachingPlacement, resolve_text_encoder_fp8
from .family import edit_family
from .variants import AUTO, resolve_variant, variant_from_diffusers_dir, variant_from_file

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
                                   vision=True, extra_config={"zero_cond_t": edit.zero_cond_t})
    components.text_encoder_placement = CachingPlacement(components, one_byte=fp8 == "keep")
    components.family = edit_family(edit)
    return components


def load_edit_diffusers_dir(path: str | Path, storage: str = "float8", compute_dtype: torch.dtype = torch.bfloat16,
                            device: str | torch.device = "cpu", variant: str = AUTO) -> QwenImageComponents:
    """An edit model set from a diffusers Qwen-Image-Edit folder (as diffusers_dir.load_diffusers_dir)."""
    from ...models.diffusers_dir import load_diffusers_dir

    edit = resolve_variant(_choice(variant), variant_from_diffusers_dir(path))
    components = load_diffusers_dir(path, storage, compute_dtype, device)
    components.family = edit_family(edit)
    return components


def load_edit_model_set(source: str, device, storage: str = "float8", compute_dtype: str = "auto",
                        transformer=None, text_encoder=None, vae=None, tokenizer=None, diffusers_folder=None,
                        text_encoder_fp8: str = "dequantize", variant: str = AUTO) -> QwenImageComponents:
    """What the Load Edit node loads, from a run file's [model] settings (models/source.py's sources): the tiny
    test model as `variant` (auto: Edit-2511, as the node), a diffusers Edit folder, or three files; a Qwen-Image
    2.1 transformer file or folder loads as 2.1 (as the node: it edits when its dataset has references), which
    has no variants, so `variant` must be auto."""
    from ...models.source import DIFFUSERS, FILES, SHAPES, TINY, resolve_compute_dtype
    from ..qwen_image21.recognise import is_qwen_image21_file, is_qwen_image21_folder, load_from_settings
    from .tiny import build_tiny_edit_components

    if ((source == FILES and is_qwen_image21_file(transformer))
            or (source == DIFFUSERS and is_qwen_image21_folder(diffusers_folder))):
        if _choice(variant) != AUTO:
            raise UserInputError(f"[edit] variant = {variant!r}, but the model is Qwen-Image 2.1, which has no Edit "
                                 "variants (it edits when its dataset has reference images): set variant = \"auto\" "
                                 "or leave it out.")
        # the text encoder file where one is set (vae and tokenizer are Qwen-Image's: 2.1 reads its folder's)
        return load_from_settings(source, device, storage, compute_dtype, transformer, diffusers_folder, text_encoder,
                                  text_encoder_fp8=text_encoder_fp8)
    dtype = resolve_compute_dtype(compute_dtype, device)
    if source == TINY:
        return build_tiny_edit_components(TINY_AUTO_VARIANT if _choice(variant) == AUTO else variant,
                                          storage=storage, compute_dtype=dtype, device=device)
    if source == SHAPES:
        raise UserInputError("[edit] needs a Qwen-Image-Edit model, and the shapes model is a text-to-image one: set "
                             "[model] source = \"tiny\" (the tiny Edit test model), an Edit diffusers_folder or Edit "
                             "model files, or remove [edit].")
    if source == DIFFUSERS:
        return load_edit_diffusers_dir(str(diffusers_folder).strip(), storage=storage, compute_dtype=dtype,
                                       device=device, variant=variant)
    if source != FILES:
        raise UserInputError(f"source={source!r} is not one of the Load Edit node's sources.")
    return load_edit_single_files(transformer, text_encoder, vae, tokenizer_dir=tokenizer, storage=storage,
                                  compute_dtype=dtype, device=device, text_encoder_fp8=text_encoder_fp8,
                                  variant=variant)
