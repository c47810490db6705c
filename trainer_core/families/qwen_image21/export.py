"""The tiny Qwen-Image 2.1 (tiny.py) written out (`export-tiny --model qwen-image-2.1`).

    layout comfyui:    DIR/diffusion_models/qwen_image21_tiny_{bf16,fp8_e4m3fn,fp8_e4m3fn_scaled}.safetensors
                       (MLP fused as `gate_up`, as ComfyUI's files hold it) and ..._bf16_split_mlp.safetensors,
                       each with its config JSON; DIR/text_encoders/qwen3vl_tiny_bf16.safetensors, the Qwen3-VL text
                       encoder in ComfyUI's layout (with its config JSON); DIR/vae/qwen_image21_tiny_vae_bf16.safetensors,
                       the VAE in the layout a newer ComfyUI reads (families/qwen_image21/vae_file.py; with its config
                       JSON); DIR/qwen_image21_tiny/ a diffusers folder for the processor (and the VAE and text encoder
                       again)
    layout diffusers:  DIR/qwen_image21_tiny/ (transformer/ too)
"""

from __future__ import annotations

import json
from pathlib import Path

from ...core.files import write_safetensors_atomic
from ...models.part_files import check_layout, public_config
from .files import comfyui_transformer_tensors
from .folder import save_qwen_image21_folder
from .text_file import comfyui_text_encoder_tensors
from .vae_file import comfyui_vae_tensors

FORMATS = ("bf16", "fp8_e4m3fn", "fp8_e4m3fn_scaled")


def export_tiny_qwen_image21(components, folder: str | Path, layout: str = "comfyui") -> dict[str, Path]:
    """The tiny 2.1 model set `components` as files (module docstring)."""
    check_layout(layout)
    root = Path(folder)
    out = {"diffusers_folder": save_qwen_image21_folder(components, root / "qwen_image21_tiny")}
    if layout == "diffusers":
        return out
    config = components.transformer.config
    sidecar = {"axes_dims_rope": list(config.axes_dims_rope), "causal_condition": config.causal_condition}
    for fmt, mlp in [(f, "fused") for f in FORMATS] + [("bf16", "split")]:
        name = f"qwen_image21_tiny_{fmt}" + ("_split_mlp" if mlp == "split" else "")
        path = root / "diffusion_models" / f"{name}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_safetensors_atomic(comfyui_transformer_tensors(components.transformer, fmt, mlp), path,
                                 metadata={"format": "pt"})
        path.with_suffix(".json").write_text(json.dumps({"part": "transformer", "format": fmt, "config": sidecar}))
        out[f"transformer_{fmt}" + ("_split_mlp" if mlp == "split" else "")] = path
    encoder = root / "text_encoders" / "qwen3vl_tiny_bf16.safetensors"  # ComfyUI's layout (text_file.py)
    encoder.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors_atomic(comfyui_text_encoder_tensors(components.text_encoder), encoder, metadata={"format": "pt"})
    encoder.with_suffix(".json").write_text(json.dumps({"part": "text encoder",
                                                        "config": components.text_encoder.config.to_dict()}))
    out["text_encoder"] = encoder
    vae = root / "vae" / "qwen_image21_tiny_vae_bf16.safetensors"
    vae.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors_atomic(comfyui_vae_tensors(components.vae), vae, metadata={"format": "pt"})
    vae.with_suffix(".json").write_text(json.dumps({"part": "vae", "format": "bf16",
                                                    "config": public_config(components.vae.config)}))
    out["vae"] = vae
    return out
