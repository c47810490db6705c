"""Live previews while training: their settings, the small copies a trainer keeps, and the images hosts show.

When previews are made is periodic work (training/periodic.py: StepExtras); this module is PIL only: a
side-by-side of the newest preview and the loss plot, and a grid of the previews kept so far, labelled by step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from PIL import Image, ImageChops, ImageDraw, ImageStat

from ..data.pixels import has_alpha, on_checkerboard

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


def image_difference(a: Image.Image, b: Image.Image) -> float | None:
    """The mean absolute difference of two pictures' RGB values, and alpha values when either has transparency (a
    2.1 LoRA's RGBA previews; an opaque picture's alpha is 1), on a 0-1 scale (0: the same picture; 1: white against
    black everywhere); None for pictures of different sizes (the preview size changed between them)."""
    if a.size != b.size:
        return None
    mode = "RGBA" if has_alpha(a) or has_alpha(b) else "RGB"
    means = ImageStat.Stat(ImageChops.difference(a.convert(mode), b.convert(mode))).mean  # per band, 0-255
    return sum(means) / (len(means) * 255.0)


@dataclass
class PreviewMovement:
    """How far each live preview has moved, from the untrained model's (the step-0 preview) and from the one before
    (`image_difference` of the full-size pictures). A LoRA that collapses into noise or texture moves far from both at
    once while its loss says little (a known failure of 2.1 LoRAs); a healthy one moves from the untrained picture
    steadily and less and less from the one before. The pictures are also kept in the run folder
    (saved_previews.py), so a trainer resumed from a checkpoint measures from the same untrained picture."""

    untrained: Image.Image | None = None
    previous: Image.Image | None = None

    def measure(self, preview: StepPreview) -> tuple[float | None, float | None]:
        """(moved from the untrained preview, moved from the previous one) for `preview`, which becomes the previous
        one (and, at step 0, the untrained one)."""
        if preview.step == 0:
            self.untrained = preview.image
        moved = tuple(None if ref is None else image_difference(preview.image, ref)
                      for ref in (self.untrained, self.previous))
        self.previous = preview.image
        return moved


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


def for_display(image: Image.Image, side: int) -> Image.Image:
    """`image` made to fit a side x side square for a person to look at, RGB: a larger one scaled down (`contain`), a
    small one (a small model's 64 px preview) enlarged by the largest whole factor that fits, nearest neighbour:
    each pixel a square block, nothing blurred or made up; one with transparency (a 2.1 LoRA's preview) over a
    checkerboard. Only what is shown changes; what was sampled is kept."""
    factor = side // max(image.size)
    if factor < 2:
        return on_checkerboard(contain(image, side))
    return on_checkerboard(image.resize((image.width * factor, image.height * factor), Image.Resampling.NEAREST))


def side_by_side(left: Image.Image, right: Image.Image, gap: int = 8) -> Image.Image:
    """Two images in a row on white, top-aligned."""
    out = Image.new("RGB", (left.width + gap + right.width, max(left.height, right.height)), "white")
    out.paste(left.convert("RGB"), (0, 0))
    out.paste(right.convert("RGB"), (left.width + gap, 0))
    return out


LABEL_HEIGHT = 20


def no_previews_text(preview_every: int, step: int) -> str:
    if not preview_every:
        return "no previews yet.\nSet Train Steps' preview_every above 0 and queue."
    due = (step // preview_every + 1) * preview_every
    return (f"no previews yet: Train Steps' preview_every\nis {preview_every} and the run is at step {step}:\n"
            f"the first comes at step {due}. Queue\nTrain Steps again, or lower preview_every.")


def step_grid(previews: list[StepPreview], columns: int = 0, tile: int = 256, title: str = "",
              preview_every: int = 0, step: int = 0) -> Image.Image:
    """The previews as tiles of `tile` pixels (longest side; a small preview enlarged by a whole factor, nearest
    neighbour, and centred), each with a 'step N' label under it, in rows of
    `columns` (0: about square). With none, an image that says how to get some: `preview_every` (as Train Steps
    last asked, 0 = off) and the run's `step` tell whether that is a setting or steps still to train."""
    if not previews:
        img = Image.new("RGB", (max(tile, 400), tile), "white")
        ImageDraw.Draw(img).text((8, 8), f"{title + ': ' if title else ''}{no_previews_text(preview_every, step)}",
                                 fill="black")
        return img
    columns = columns or math.ceil(math.sqrt(len(previews)))
    columns = min(columns, len(previews))
    rows = math.ceil(len(previews) / columns)
    cell_h = tile + LABEL_HEIGHT
    out = Image.new("RGB", (columns * tile, rows * cell_h), "white")
    draw = ImageDraw.Draw(out)
    for i, preview in enumerate(previews):
        x, y = (i % columns) * tile, (i // columns) * cell_h
        image = for_display(preview.image, tile)  # a small model's preview enlarged, pixels kept; alpha on a checkerboard
        out.paste(image, (x + (tile - image.width) // 2, y + (tile - image.height) // 2))
        draw.text((x + 4, y + tile + 4), f"step {preview.step}", fill="black")
    return out
