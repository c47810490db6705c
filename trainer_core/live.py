"""What happens every N steps while training, besides checkpoints: preview images and LoRA snapshots.

`Trainer.train(n, on_step, extras=StepExtras(...))` decides when (every `preview_every` / `snapshot_every`
optimizer steps, counted from the run's first step, like `checkpoint_every`), makes them, and hands them to
`on_step` on its StepReport; a host (a ComfyUI node, the command line) only shows or reports them. The
images here are PIL only: a side-by-side of the newest preview and the loss plot, and a grid of the
previews kept so far, labelled by step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

# The trainer keeps this many previews for comparing steps (the oldest go first), each at most
# KEPT_PREVIEW_SIDE pixels on its longest side.
MAX_KEPT_PREVIEWS = 32
KEPT_PREVIEW_SIDE = 256


@dataclass(frozen=True)
class PreviewSettings:
    """One fixed prompt and seed, so previews compare across steps."""

    prompt: str
    negative_prompt: str = ""
    size: int = 512
    steps: int = 20
    cfg: float = 4.0
    seed: int = 0


@dataclass
class StepPreview:
    step: int
    image: Image.Image
    seconds: float  # what sampling it cost


@dataclass
class StepExtras:
    """`preview_every` / `snapshot_every`: every N steps (0 = off). `snapshot_path(step)` is where the
    LoRA snapshot of that step goes (the host decides the folder and name)."""

    preview_every: int = 0
    preview: PreviewSettings | None = None
    snapshot_every: int = 0
    snapshot_path: Callable[[int], Path] | None = None
    # Called after each sampling step of a preview (step, of steps); may raise to stop (a host's Cancel).
    on_sampling_step: Callable[[int, int], None] | None = None

    def preview_due(self, step: int) -> bool:
        return bool(self.preview_every) and self.preview is not None and step % self.preview_every == 0

    def snapshot_due(self, step: int) -> bool:
        return bool(self.snapshot_every) and self.snapshot_path is not None and step % self.snapshot_every == 0


def keep_preview(kept: list[StepPreview], preview: StepPreview) -> None:
    """Add a small copy of `preview` to `kept`, replacing one of the same step, at most MAX_KEPT_PREVIEWS."""
    small = preview.image.copy()
    small.thumbnail((KEPT_PREVIEW_SIDE, KEPT_PREVIEW_SIDE))
    kept[:] = [p for p in kept if p.step != preview.step]
    kept.append(StepPreview(preview.step, small, preview.seconds))
    kept.sort(key=lambda p: p.step)
    del kept[:-MAX_KEPT_PREVIEWS]


def contain(image: Image.Image, side: int) -> Image.Image:
    """`image` scaled down (never up) to fit a side x side square."""
    if max(image.size) <= side:
        return image
    scale = side / max(image.size)
    return image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.BILINEAR)


def side_by_side(left: Image.Image, right: Image.Image, gap: int = 8) -> Image.Image:
    """Two images in a row on white, top-aligned."""
    out = Image.new("RGB", (left.width + gap + right.width, max(left.height, right.height)), "white")
    out.paste(left.convert("RGB"), (0, 0))
    out.paste(right.convert("RGB"), (left.width + gap, 0))
    return out


LABEL_HEIGHT = 20


def step_grid(previews: list[StepPreview], columns: int = 0, tile: int = 256, title: str = "") -> Image.Image:
    """The previews as tiles of `tile` pixels (longest side), each with a 'step N' label under it, in rows of
    `columns` (0: about square). With none, an image that says how to get some."""
    if not previews:
        img = Image.new("RGB", (max(tile, 320), tile), "white")
        ImageDraw.Draw(img).text((8, 8), f"{title + ': ' if title else ''}no previews yet.\nSet Train Steps' "
                                          "preview_every above 0 and queue.", fill="black")
        return img
    columns = columns or math.ceil(math.sqrt(len(previews)))
    columns = min(columns, len(previews))
    rows = math.ceil(len(previews) / columns)
    cell_h = tile + LABEL_HEIGHT
    out = Image.new("RGB", (columns * tile, rows * cell_h), "white")
    draw = ImageDraw.Draw(out)
    for i, preview in enumerate(previews):
        x, y = (i % columns) * tile, (i // columns) * cell_h
        image = preview.image.convert("RGB")
        scale = tile / max(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.BILINEAR)
        out.paste(image, (x + (tile - image.width) // 2, y + (tile - image.height) // 2))
        draw.text((x + 4, y + tile + 4), f"step {preview.step}", fill="black")
    return out
