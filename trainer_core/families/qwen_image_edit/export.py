"""The tiny Qwen-Image-Edit written out (`export-tiny --model edit-2511`): ComfyUI's single files (an Edit-2511
transformer file carries ComfyUI's marker key, as ComfyUI's own 2511 files do; '2509' in a name is how a file tells
Edit-2509 from Edit, variants.py) or a diffusers folder whose model_index.json names the variant's pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...core.files import write_bytes_atomic, write_safetensors_atomic
from ...models.diffusers_dir import save_diffusers_dir
from ...models.part_files import check_layout, export_comfyui_files
from ...models.safetensors_file import SafetensorsFile
from .variants import ZERO_COND_MARKER


def edit_file_stem(variant: str) -> str:
    """'edit_2511_tiny' etc.: the files read `qwen_image_edit_2511_tiny_bf16.safetensors`."""
    return {"edit": "edit_tiny"}.get(variant, f"{variant.replace('-', '_')}_tiny")


def export_tiny_edit(components, folder: str | Path, layout: str = "comfyui") -> dict[str, Path]:
    """The tiny Edit model set `components` (of one variant's family) as files (module docstring)."""
    check_layout(layout)
    variant = components.family.variant
    if layout == "diffusers":
        root = save_diffusers_dir(components, folder)
        index = json.loads((root / "model_index.json").read_text())
        write_bytes_atomic(json.dumps({**index, "_class_name": variant.pipeline}, indent=2).encode(),
                           root / "model_index.json")
        return {"diffusers_folder": root}
    written = export_comfyui_files(components, folder, stem=edit_file_stem(variant.name))
    if variant.zero_cond_t:
        for name, path in written.items():
            if name.startswith("transformer_"):
                file = SafetensorsFile(path, "transformer")
                tensors = {k: file.tensor(k) for k in file.keys}
                tensors[ZERO_COND_MARKER] = torch.tensor([])  # ComfyUI's registered empty buffer
                write_safetensors_atomic(tensors, path, metadata={"format": "pt"})
    return written
