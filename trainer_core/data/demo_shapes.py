"""The built-in demo data every family's demo paints: one coloured shape per image, its caption naming colour and
shape (learnable in a few hundred CPU steps). Text-to-image trains on these images as they are; Qwen-Image-Edit
paints the shapes as edit targets and controls, Qwen-Image-Layered as layers on a card."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

from ..core.config import DatasetConfig
from .images import discover

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "yellow": (235, 200, 30)}
SHAPES = ("circle", "square")
PREVIEW_PROMPT = "a red circle on a white background"


def make_demo_dataset(folder: str | Path, size: int = 64) -> Path:
    """Write 8 images (4 colours x 2 shapes, one of them wide) with captions into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for n, (colour, shape) in enumerate((c, s) for c in COLOURS for s in SHAPES):
        width = size * 2 if n == 7 else size  # one wide image: a second aspect bucket
        img = Image.new("RGB", (width, size), "white")
        draw = ImageDraw.Draw(img)
        m = size // 4
        box = (width // 2 - m, m, width // 2 + m, size - m)
        (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLOURS[colour])
        img.save(folder / f"{n:02d}_{colour}_{shape}.png")
        (folder / f"{n:02d}_{colour}_{shape}.txt").write_text(f"a {colour} {shape} on a white background\n")
    return folder


def demo_samples(folder: Path):
    """(the text-to-image demo's training samples written into `folder`, no family data settings)."""
    folder = make_demo_dataset(folder)
    return discover(DatasetConfig(folder=str(folder), resolution=64, min_bucket_side=32, max_bucket_side=128)), None
