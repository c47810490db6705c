"""The Layered family's built-in demo data (`python -m trainer_core demo --model qwen-image-layered`).

A learnable decomposition: each composite is a coloured shape on a grey card; layer 1 is the grey card
(opaque), layer 2 the shape alone on transparency. The caption names colour and shape.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

from ...core.config import DatasetConfig
from ...data.demo_shapes import COLOURS, SHAPES
from .data import load_layered_dataset

GREY = (128, 128, 128, 255)
RUN_NAME = "layered_demo"
LORA_NAME = "layered_lora.safetensors"
PREVIEW_PROMPT = "a red circle on a grey card"


def make_layered_demo_dataset(folder: str | Path, size: int = 64) -> Path:
    """8 layered samples (4 colours x 2 shapes), 2 layers each, into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for n, (colour, shape) in enumerate((c, s) for c in COLOURS for s in SHAPES):
        name = f"{n:02d}_{colour}_{shape}"
        card = Image.new("RGBA", (size, size), GREY)
        figure = Image.new("RGBA", (size, size), (0, 0, 0, 0))
        m = size // 4
        draw = ImageDraw.Draw(figure)
        box = (m, m, size - m, size - m)
        (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=(*COLOURS[colour], 255))
        Image.alpha_composite(card, figure).save(folder / f"{name}.png")
        card.save(folder / f"{name}_layer_1.png")
        figure.save(folder / f"{name}_layer_2.png")
        (folder / f"{name}.txt").write_text(f"a {colour} {shape} on a grey card\n")
    return folder


def demo_samples(folder: str | Path) -> tuple[list, None]:
    """(the training samples, no data settings) of the built-in layered dataset written into `folder`."""
    folder = make_layered_demo_dataset(folder)
    dataset = load_layered_dataset(DatasetConfig(folder=str(folder), resolution=64, min_bucket_side=32,
                                                 max_bucket_side=128))
    return list(dataset.samples), None
