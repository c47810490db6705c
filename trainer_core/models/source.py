"""The Qwen-Image a run trains, from any of the Load settings' sources: model files, a diffusers folder, the
tiny test model or the small pretrained shapes model. The Load node and the command line's `train` both load
through `load_model_set` (by way of families.recognise.load_recognised); each only finds the paths its own way (ComfyUI's model folders, or a run file). The
shapes model ships in the repository (models/pretrained.py) and loads through the loader of ComfyUI's own files."""

from __future__ import annotations

from pathlib import Path

import torch

from ..core.config import MODEL_SOURCES
from ..core.errors import UserInputError
from .components import QwenImageComponents

FILES, DIFFUSERS, TINY, SHAPES = MODEL_SOURCES


def resolve_compute_dtype(choice: str, device: torch.device) -> torch.dtype:
    """LoadConfig.compute_dtype: 'auto' is bfloat16 on a GPU and float32 on a CPU (no fast bf16 matmul there)."""
    if choice == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, choice)


def load_model_set(source: str, device: torch.device, storage: str = "float8", compute_dtype: str = "auto",
                   transformer: str | Path | None = None, text_encoder: str | Path | None = None,
                   vae: str | Path | None = None, tokenizer: str | Path | None = None,
                   diffusers_folder: str | Path | None = None,
                   text_encoder_fp8: str = "dequantize") -> QwenImageComponents:
    """Load the parts of `source` (one of MODEL_SOURCES) for training on `device`. `text_encoder_fp8`: a decided
    mode ('keep' or 'dequantize'), read for model files only. The model set has no family: it is loaded through
    `families.qwen_image.load_model_set` (or `families.recognise.load_recognised`), which hands it one."""
    from . import build_tiny_components, load_diffusers_dir, load_single_files

    dtype = resolve_compute_dtype(compute_dtype, device)
    if source == TINY:
        return build_tiny_components(seed=0, storage=storage, compute_dtype=dtype, device=device)
    if source == SHAPES:
        from .pretrained import load_shapes_model

        return load_shapes_model(storage=storage, compute_dtype=dtype, device=device)
    if source == DIFFUSERS:
        if not diffusers_folder or not str(diffusers_folder).strip():
            raise UserInputError("diffusers_folder is empty: enter the path of a diffusers Qwen-Image folder.")
        return load_diffusers_dir(str(diffusers_folder).strip(), storage=storage, compute_dtype=dtype, device=device)
    if source != FILES:
        raise UserInputError(f"source={source!r} is not one of {list(MODEL_SOURCES)}.")
    return load_single_files(transformer, text_encoder, vae, tokenizer_dir=tokenizer, storage=storage,
                             compute_dtype=dtype, device=device, text_encoder_fp8=text_encoder_fp8)
