"""How a Load setting says it is Qwen-Image 2.1, and its model set from those settings.

From files: the transformer file has 2.1's text projection (`txt_in.text_norm.weight`, under any prefix ComfyUI's
files use; Qwen-Image's has `txt_norm.weight`). Its Qwen3-VL text encoder may be ComfyUI's single file too
(text_file.py), and so may its VAE (vae_file.py: the layout a newer ComfyUI reads); its processor (and the VAE
when no VAE file is chosen) come from a diffusers 2.1 folder (the Load setting `diffusers_folder`). From a folder:
its transformer's config (or its model_index.json) names 2.1's classes.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...core.choices import NOT_USED
from ...core.errors import UserInputError
from ...models.qwen21_arch import TRANSFORMER_CLASS, TRANSFORMER_PROBE

PIPELINE_CLASS = "QwenImage21Pipeline"


def is_qwen_image21_file(path) -> bool:
    """Whether the safetensors file at `path` is a 2.1 transformer (its header only; False when unreadable)."""
    from ...models.safetensors_file import SafetensorsFile

    if not path or not Path(path).is_file():
        return False
    try:
        keys = SafetensorsFile(path, "transformer").keys
    except UserInputError:
        return False  # the part's own loader says what is wrong with it
    return any(k == TRANSFORMER_PROBE or k.endswith("." + TRANSFORMER_PROBE) for k in keys)


def _class_name(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None


def is_qwen_image21_folder(folder) -> bool:
    if not folder or not str(folder).strip():
        return False
    root = Path(str(folder).strip())
    return (_class_name(root / "transformer" / "config.json") == TRANSFORMER_CLASS
            or _class_name(root / "model_index.json") == PIPELINE_CLASS)


def load_from_settings(source: str, device, storage: str, compute_dtype: str, transformer=None,
                       diffusers_folder=None, text_encoder=None, vae=None, text_encoder_fp8: str = "dequantize"):
    """The 2.1 model set the Load settings name (source files or diffusers folder), or None when they are not 2.1.
    With a 2.1 transformer file, `text_encoder` (a path, or None) is ComfyUI's Qwen3-VL file (text_file.py) and
    `vae` ComfyUI's 2.1 VAE file (vae_file.py); without them the folder's are read. `text_encoder_fp8` may be the
    Load settings' 'auto', decided here for `device` with 2.1's parts (`planner.resolve_text_encoder_fp8`)."""
    from ...models.source import DIFFUSERS, FILES, resolve_compute_dtype
    from ...planner.device import resolve_text_encoder_fp8
    from ...planner.inference import real_parts21
    from .folder import load_qwen_image21_folder

    dtype = resolve_compute_dtype(compute_dtype, device)
    if not text_encoder or str(text_encoder) == NOT_USED:
        text_encoder = None
    if not vae or str(vae) == NOT_USED:
        vae = None
    if source == FILES and is_qwen_image21_file(transformer):
        if not is_qwen_image21_folder(diffusers_folder):
            raise UserInputError(
                f"transformer file {transformer} is Qwen-Image 2.1: its processor (and its VAE and Qwen3-VL text "
                f"encoder, unless their files are chosen) are read from a diffusers Qwen-Image 2.1 folder. Set "
                f"diffusers_folder to that folder (it holds processor/, vae/ and text_encoder/; now "
                f"{str(diffusers_folder or '').strip() or 'empty'}).")
        fp8 = resolve_text_encoder_fp8(text_encoder_fp8, device, parts=real_parts21(lm_head=False)) if text_encoder else "dequantize"
        return load_qwen_image21_folder(str(diffusers_folder).strip(), transformer_file=transformer, storage=storage,
                                        compute_dtype=dtype, device=device, text_encoder_file=text_encoder,
                                        vae_file=vae, text_encoder_fp8=fp8)
    if source == DIFFUSERS and is_qwen_image21_folder(diffusers_folder):
        return load_qwen_image21_folder(str(diffusers_folder).strip(), storage=storage, compute_dtype=dtype,
                                        device=device)
    return None
