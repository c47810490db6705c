"""The Edit family's built-in demo data (`python -m trainer_core demo --model edit-2511`; demo.run_demo trains).

The dataset is a learnable edit: control 1 is a grey shape, control 2 (Edit-2509/2511) a swatch of a colour,
and the target is that shape painted in that colour; the caption says so ("paint the circle red"). With Edit
(one control) the caption alone names the colour. Controls use the same-folder form (`name_control.png`,
`name_control_2.png`); one control is wider than its target, so the controls keep their own aspect ratio.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

from ...core.config import DatasetConfig, EditDataConfig
from ...data.demo_shapes import COLOURS, SHAPES
from ...data.edit_dataset import load_edit_dataset

GREY = (128, 128, 128)
RUN_NAME = "edit_demo"
LORA_NAME = "edit_lora.safetensors"
# Tiny controls: the model's own rule (1024 px) costs a CPU ~30 s per VAE encode. At 96 px of side the
# 32 px grid keeps the demo's square and 2:1 controls exact.
CONTROL_RESOLUTION = 96
PREVIEW_PROMPT = "paint the circle red"


def _shape(size: tuple[int, int], shape: str, colour) -> Image.Image:
    img = Image.new("RGB", size, "white")
    w, h = size
    m = min(w, h) // 4
    box = (w // 2 - m, h // 2 - m, w // 2 + m, h // 2 + m)
    (ImageDraw.Draw(img).ellipse if shape == "circle" else ImageDraw.Draw(img).rectangle)(box, fill=colour)
    return img


def make_edit_demo_dataset(folder: str | Path, controls: int = 2, size: int = 64) -> Path:
    """8 edit samples (4 colours x 2 shapes) with `controls` (1 or 2) control images each, into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for n, (colour, shape) in enumerate((c, s) for c in COLOURS for s in SHAPES):
        name = f"{n:02d}_{colour}_{shape}"
        _shape((size, size), shape, COLOURS[colour]).save(folder / f"{name}.png")
        control_size = (size * 2, size) if n == 3 else (size, size)  # one wider control (2:1)
        _shape(control_size, shape, GREY).save(folder / f"{name}_control.png")
        if controls >= 2:
            Image.new("RGB", (size // 2, size // 2), COLOURS[colour]).save(folder / f"{name}_control_2.png")
        (folder / f"{name}.txt").write_text(f"paint the {shape} {colour}\n")
    return folder


def demo_samples(folder: str | Path, controls: int) -> tuple[list, EditDataConfig]:
    """(the training samples, their data settings) of the built-in edit dataset written into `folder`."""
    folder = make_edit_demo_dataset(folder, controls=controls)
    settings = EditDataConfig(control_resolution=CONTROL_RESOLUTION)
    dataset = load_edit_dataset(DatasetConfig(folder=str(folder), resolution=64, min_bucket_side=32,
                                              max_bucket_side=128), settings)
    return list(dataset.samples), settings
