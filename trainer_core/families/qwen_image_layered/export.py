"""The tiny Qwen-Image-Layered written out (`export-tiny --model qwen-image-layered`): ComfyUI's single files
(qwen_image_layered_tiny_*: the transformer with `time_text_embed.addition_t_embedding`, the RGBA VAE) or a diffusers
folder whose model_index.json names `QwenImageLayeredPipeline`."""

from __future__ import annotations

import json
from pathlib import Path

from ...core.files import write_bytes_atomic
from ...models.diffusers_dir import save_diffusers_dir
from ...models.part_files import check_layout, export_comfyui_files


def export_tiny_layered(components, folder: str | Path, layout: str = "comfyui") -> dict[str, Path]:
    check_layout(layout)
    if layout == "diffusers":
        root = save_diffusers_dir(components, folder)
        index = json.loads((root / "model_index.json").read_text())
        write_bytes_atomic(json.dumps({**index, "_class_name": "QwenImageLayeredPipeline"}, indent=2).encode(),
                           root / "model_index.json")
        return {"diffusers_folder": root}
    return export_comfyui_files(components, folder, stem="layered_tiny")
