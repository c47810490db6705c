"""Model parts as the single files ComfyUI users have, each with a config JSON beside it.

`write_part_file` is the one writer: tensors (from transformer_file / text_encoder_file / vae_file, or a family's own
layouts) into `<name>.safetensors`, plus `<name>.json` = {"part", "format", "config"} that the loaders read for the
values tensor shapes cannot tell. `export_comfyui_files` writes a Qwen-Image model set (the MMDiT transformer,
Qwen2.5-VL, the Wan-layout VAE) in every format, laid out like ComfyUI's models folder, so tests, the demo and a real
ComfyUI can all load the same files (the families' `export_tiny` hooks write their tiny models with it):

    DIR/diffusion_models/qwen_image_<stem>_bf16.safetensors            (+ .json)
    DIR/diffusion_models/qwen_image_<stem>_fp8_e4m3fn.safetensors
    DIR/diffusion_models/qwen_image_<stem>_fp8_e4m3fn_scaled.safetensors
    DIR/text_encoders/qwen_2.5_vl_<stem>.safetensors
    DIR/text_encoders/qwen_2.5_vl_<stem>_fp8_scaled.safetensors
    DIR/vae/qwen_image_<stem>_vae.safetensors
    DIR/tokenizer/                                                    (save_pretrained)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..core.choices import EXPORT_LAYOUTS
from ..core.files import write_bytes_atomic, write_safetensors_atomic
from .components import QwenImageComponents
from .text_encoder_file import text_encoder_file_tensors
from .transformer_file import transformer_file_tensors
from .vae_file import vae_file_tensors


def check_layout(layout: str) -> None:
    if layout not in EXPORT_LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {EXPORT_LAYOUTS}")


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
