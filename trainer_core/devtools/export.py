"""Write Qwen-Image parts as the single files ComfyUI users have, each with a config JSON beside it.

`write_part_file` is the one writer: tensors (from transformer_file / text_encoder_file / vae_file)
into `<name>.safetensors`, plus `<name>.json` = {"part", "format", "config"} that the loaders read for
the values tensor shapes cannot tell. `export_tiny` writes the tiny test model in every format, laid
out like ComfyUI's models folder, so tests, the demo and a real ComfyUI can all load the same files:

    DIR/diffusion_models/qwen_image_tiny_bf16.safetensors            (+ .json)
    DIR/diffusion_models/qwen_image_tiny_fp8_e4m3fn.safetensors
    DIR/diffusion_models/qwen_image_tiny_fp8_e4m3fn_scaled.safetensors
    DIR/text_encoders/qwen_2.5_vl_tiny.safetensors
    DIR/text_encoders/qwen_2.5_vl_tiny_fp8_scaled.safetensors
    DIR/vae/qwen_image_tiny_vae.safetensors
    DIR/tokenizer/                                                    (save_pretrained)

`export_tiny(..., model="qwen-image-2512")` writes the same files named as ComfyUI's Qwen-Image-2512 release
(`qwen_image_2512_tiny_fp8_e4m3fn.safetensors`, ...): 2512 has Qwen-Image's architecture and tensor names, new
weights only, so nothing but the name differs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..core.files import write_bytes_atomic, write_safetensors_atomic
from ..models.components import QwenImageComponents
from ..models.diffusers_dir import save_diffusers_dir
from ..models.text_encoder_file import text_encoder_file_tensors
from ..models.tiny import build_tiny_components
from ..models.transformer_file import transformer_file_tensors
from ..models.vae_file import vae_file_tensors

EXPORT_LAYOUTS = ("comfyui", "diffusers")
# Text-to-image models export-tiny writes -> the stem of their file names (qwen_image_<stem>_bf16.safetensors).
TEXT_TO_IMAGE_STEMS = {"qwen-image": "tiny", "qwen-image-2512": "2512_tiny"}


def public_config(config) -> dict:
    """A model config as plain JSON data, without diffusers' bookkeeping keys (`_class_name`, ...)."""
    return json.loads(json.dumps({k: v for k, v in dict(config).items() if not k.startswith("_")}))


def write_part_file(tensors: dict[str, torch.Tensor], path: str | Path, part: str, fmt: str, config: dict) -> Path:
    """`path` (.safetensors, atomically) and its config JSON beside it."""
    path = Path(path)
    write_safetensors_atomic(tensors, path, metadata={"format": "pt"})
    sidecar = {"part": part, "format": fmt, "config": config}
    write_bytes_atomic(json.dumps(sidecar, indent=2).encode(), path.with_suffix(".json"))
    return path


def export_comfyui_files(components: QwenImageComponents, folder: str | Path, stem: str = "tiny") -> dict[str, Path]:
    """Every part of `components` in ComfyUI's single-file layouts (see the module docstring)."""
    root = Path(folder)
    transformer_config = public_config(components.transformer.config)
    text_config = components.text_encoder.config.to_dict()
    out: dict[str, Path] = {}
    for fmt, suffix in (("bf16", "bf16"), ("fp8_e4m3fn", "fp8_e4m3fn"), ("fp8_e4m3fn_scaled", "fp8_e4m3fn_scaled")):
        out[f"transformer_{suffix}"] = write_part_file(
            transformer_file_tensors(components.transformer, fmt),
            root / "diffusion_models" / f"qwen_image_{stem}_{suffix}.safetensors", "transformer", fmt, transformer_config)
    for fmt, suffix in (("bf16", ""), ("fp8_scaled", "_fp8_scaled")):
        out[f"text_encoder_{fmt}"] = write_part_file(
            text_encoder_file_tensors(components.text_encoder, fmt),
            root / "text_encoders" / f"qwen_2.5_vl_{stem}{suffix}.safetensors", "text encoder", fmt, text_config)
    out["vae"] = write_part_file(vae_file_tensors(components.vae), root / "vae" / f"qwen_image_{stem}_vae.safetensors",
                                 "vae", "bf16", public_config(components.vae.config))
    components.tokenizer.save_pretrained(str(root / "tokenizer"))
    out["tokenizer"] = root / "tokenizer"
    return out


def export_tiny(folder: str | Path, layout: str = "comfyui", seed: int = 0,
                model: str = "qwen-image") -> dict[str, Path]:
    """The tiny test model (`build_tiny_components(seed)`) as ComfyUI single files or a diffusers folder, its
    files named as `model`'s (TEXT_TO_IMAGE_STEMS)."""
    if layout not in EXPORT_LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {EXPORT_LAYOUTS}")
    if model not in TEXT_TO_IMAGE_STEMS:
        raise ValueError(f"unknown model {model!r}; expected one of {list(TEXT_TO_IMAGE_STEMS)}")
    components = build_tiny_components(seed=seed, storage="float32")
    if layout == "diffusers":
        return {"diffusers_folder": save_diffusers_dir(components, folder)}
    return export_comfyui_files(components, folder, stem=TEXT_TO_IMAGE_STEMS[model])


def edit_file_stem(variant: str) -> str:
    """'edit_2511_tiny' etc.: the files read `qwen_image_edit_2511_tiny_bf16.safetensors`, and '2509' in a name
    is how a file tells Edit-2509 from Edit (families/qwen_image_edit/variants.py)."""
    return {"edit": "edit_tiny"}.get(variant, f"{variant.replace('-', '_')}_tiny")


def export_tiny_edit(folder: str | Path, variant: str = "edit-2511", layout: str = "comfyui", seed: int = 0) -> dict[str, Path]:
    """A tiny Qwen-Image-Edit (`families.qwen_image_edit.tiny`) as ComfyUI single files (an Edit-2511
    transformer file carries ComfyUI's marker key, as ComfyUI's own 2511 files do) or a diffusers folder whose
    model_index.json names the variant's pipeline."""
    from ..families.qwen_image_edit.tiny import build_tiny_edit_components
    from ..families.qwen_image_edit.variants import ZERO_COND_MARKER
    from ..models.safetensors_file import SafetensorsFile

    if layout not in EXPORT_LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {EXPORT_LAYOUTS}")
    components = build_tiny_edit_components(variant, seed=seed, storage="float32")
    if layout == "diffusers":
        root = save_diffusers_dir(components, folder)
        index = json.loads((root / "model_index.json").read_text())
        write_bytes_atomic(json.dumps({**index, "_class_name": components.family.variant.pipeline}, indent=2).encode(),
                           root / "model_index.json")
        return {"diffusers_folder": root}
    written = export_comfyui_files(components, folder, stem=edit_file_stem(variant))
    if components.family.variant.zero_cond_t:
        for name, path in written.items():
            if name.startswith("transformer_"):
                file = SafetensorsFile(path, "transformer")
                tensors = {k: file.tensor(k) for k in file.keys}
                tensors[ZERO_COND_MARKER] = torch.tensor([])  # ComfyUI's registered empty buffer
                write_safetensors_atomic(tensors, path, metadata={"format": "pt"})
    return written


def export_tiny_layered(folder: str | Path, layout: str = "comfyui", seed: int = 0) -> dict[str, Path]:
    """The tiny Qwen-Image-Layered (`families.qwen_image_layered.tiny`) as ComfyUI single files
    (qwen_image_layered_tiny_*: the transformer with `time_text_embed.addition_t_embedding`, the RGBA VAE) or
    a diffusers folder whose model_index.json names `QwenImageLayeredPipeline`."""
    from ..families.qwen_image_layered.tiny import build_tiny_layered_components

    if layout not in EXPORT_LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {EXPORT_LAYOUTS}")
    components = build_tiny_layered_components(seed=seed, storage="float32")
    if layout == "diffusers":
        root = save_diffusers_dir(components, folder)
        index = json.loads((root / "model_index.json").read_text())
        write_bytes_atomic(json.dumps({**index, "_class_name": "QwenImageLayeredPipeline"}, indent=2).encode(),
                           root / "model_index.json")
        return {"diffusers_folder": root}
    return export_comfyui_files(components, folder, stem="layered_tiny")
