"""The Load settings' sources (model files, a diffusers folder, the tiny test model, the small pretrained shapes
model) by short name, and the compute dtype 'auto' resolves to. Which family's loader reads a source is decided in
families/loading.py; the shapes model ships in the repository (models/pretrained.py) and loads through the loader of
ComfyUI's own files."""

from __future__ import annotations

import torch

from ..core.config import MODEL_SOURCES

FILES, DIFFUSERS, TINY, SHAPES = MODEL_SOURCES


def resolve_compute_dtype(choice: str, device: torch.device) -> torch.dtype:
    """LoadConfig.compute_dtype: 'auto' is bfloat16 on a GPU and float32 on a CPU (no fast bf16 matmul there)."""
    if choice == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, choice)
