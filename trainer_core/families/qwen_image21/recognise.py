"""How a Load request says it is Qwen-Image 2.1, and its model set from that request (this package's `load`,
families/loading.py).

From files: the transformer file has 2.1's text projection (`txt_in.text_norm.weight`, under any prefix ComfyUI's
files use; Qwen-Image's has `txt_norm.weight`). Its Qwen3-VL text encoder may be ComfyUI's single file too
(text_file.py), and so may its VAE (vae_file.py: the layout a newer ComfyUI reads); its processor (and the VAE
when no VAE file is chosen) come from a diffusers 2.1 folder (the Load setting `diffusers_folder`). From a folder:
its transformer's config (or its model_index.json) names 2.1's classes.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...core.choices import EDIT_VARIANT_CHOICES
from ...core.errors import UserInputError
from ...models.safetensors_file import holds_key
from .arch import TRANSFORMER_CLASS, TRANSFORMER_PROBE

PIPELINE_CLASS = "QwenImage21Pipeline"
AUTO = EDIT_VARIANT_CHOICES[0]


def is_qwen_image21_file(path) -> bool:
    """Whether the safetensors file at `path` is a 2.1 transformer (its header: its text projection's key)."""
    return holds_key(path, TRANSFORMER_PROBE)


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


def _require_diffusers_with_21(model) -> None:
    """Qwen-Image 2.1's classes came with diffusers 0.42; the pack's other families run on older ones."""
    import diffusers

    if not hasattr(diffusers, TRANSFORMER_CLASS):
        raise UserInputError(
            f"{model} is Qwen-Image 2.1, which needs diffusers 0.42.1 or newer; this Python has diffusers "
            f"{diffusers.__version__}. Run pip install -U \"diffusers>=0.42.1\" in ComfyUI's Python and restart "
            f"ComfyUI (or choose a Qwen-Image model).")


def missing_with_file(transformer) -> str | None:
    """For a run file naming only a transformer file (no text encoder, VAE nor folder): what a 2.1 file needs, which is
    the folder alone (its processor; the text encoder and VAE files are optional), else None for another model's."""
    if not is_qwen_image21_file(transformer):
        return None
    return (f"transformer = {str(transformer)!r} is Qwen-Image 2.1, which reads its processor (and its text encoder "
            "and VAE, unless their files are set) from a diffusers Qwen-Image 2.1 folder: set diffusers_folder to that "
            "folder (it holds processor/, vae/ and text_encoder/). With it, the transformer file alone trains; "
            "text_encoder and vae may stay unset (or name ComfyUI's qwen3vl_8b_* and qwen_image_2.1_vae files).")


def load(request):
    """The 2.1 model set a Load request names (its transformer file, or its diffusers folder), or None when it names
    another model. With a 2.1 transformer file, `request.text_encoder` (or None: the folder's) is ComfyUI's Qwen3-VL
    file (text_file.py) and `request.vae` ComfyUI's 2.1 VAE file (vae_file.py); its processor is the folder's (the
    request's tokenizer is Qwen-Image's and not read). `text_encoder_fp8` may be 'auto', decided here for the device
    with 2.1's parts (`planner.resolve_text_encoder_fp8`). A Load Edit request loads the same model set (it edits when
    its dataset has reference images) and must leave the Edit variant on auto: 2.1 has none."""
    from ...models.source import DIFFUSERS, FILES

    files = request.source == FILES and is_qwen_image21_file(request.transformer)
    if not files and not (request.source == DIFFUSERS and is_qwen_image21_folder(request.diffusers_folder)):
        return None
    _require_diffusers_with_21(request.transformer if files else request.diffusers_folder)
    # Only now: these modules name diffusers' 2.1 classes, which requirements.txt's floor (0.37) lacks.
    from ...planner.device import resolve_text_encoder_fp8
    from .folder import load_qwen_image21_folder
    from .plan import real_parts21

    if request.edit and request.edit_variant not in (AUTO, "edit-auto"):
        raise UserInputError(f"edit_variant is {request.edit_variant!r}, but the model is Qwen-Image 2.1, which has no "
                             "Edit variants (it edits when its dataset has reference images): set it to auto (in a "
                             "run file, [edit] variant = \"auto\" or leave it out).")
    if not files:
        return load_qwen_image21_folder(request.diffusers_folder, storage=request.storage, compute_dtype=request.dtype,
                                        device=request.device)
    if not is_qwen_image21_folder(request.diffusers_folder):
        raise UserInputError(
            f"transformer file {request.transformer} is Qwen-Image 2.1: its processor (and its VAE and Qwen3-VL text "
            f"encoder, unless their files are chosen) are read from a diffusers Qwen-Image 2.1 folder. Set "
            f"diffusers_folder to that folder (now {request.diffusers_folder or 'empty'}): the Hugging Face repository "
            "Qwen/Qwen-Image-2.1, of which model_index.json and processor/ are read when the three files are chosen "
            "(hf download Qwen/Qwen-Image-2.1 --include model_index.json \"processor/*\" --local-dir <folder>), vae/ and "
            "text_encoder/ too for a part set to (not used).")
    fp8 = (resolve_text_encoder_fp8(request.text_encoder_fp8, request.device, parts=real_parts21(lm_head=False))
           if request.text_encoder else "dequantize")
    return load_qwen_image21_folder(request.diffusers_folder, transformer_file=request.transformer,
                                    storage=request.storage, compute_dtype=request.dtype, device=request.device,
                                    text_encoder_file=request.text_encoder, vae_file=request.vae, text_encoder_fp8=fp8)
