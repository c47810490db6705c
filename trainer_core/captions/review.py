"""The captions laid out for a person to read before training: each image with the caption on disk under it.

The Caption Dataset node's picture output (the canvas shows it): tiles of `tile` px (the image scaled to fit, over a
checkerboard where it is transparent), the caption wrapped under it, marked "(kept)" when the image kept a caption it
had, "(no caption)" when the model wrote nothing usable. Reading them here and fixing a wrong one on disk is the
review; the Cache node's keys follow the caption text, so the next queue encodes only what changed.
"""

from __future__ import annotations

import math
import textwrap

from PIL import Image, ImageDraw

from ..data.images import open_image
from ..data.pixels import on_checkerboard
from .folder import EMPTY, KEPT, CaptionResult

LINE_HEIGHT = 12  # px per line of Pillow's default font
MAX_LINES = 8  # a longer caption is cut with "..." (the report has it whole)


def caption_lines(result: CaptionResult, width_chars: int) -> list[str]:
    prefix = {KEPT: "(kept) ", EMPTY: "(no caption)"}.get(result.status, "")
    lines = textwrap.wrap(prefix + result.caption, width_chars) or [prefix.strip()]
    return lines if len(lines) <= MAX_LINES else [*lines[:MAX_LINES - 1], lines[MAX_LINES - 1][:-3] + "..."]


def caption_sheet(results: list[CaptionResult], tile: int = 256, columns: int = 0) -> Image.Image:
    """The images of `results` as tiles of `tile` px with their captions under them, in rows of `columns` (0: about
    square), RGB. No results: a one-line picture that says so."""
    if not results:
        image = Image.new("RGB", (tile * 2, LINE_HEIGHT * 3), "white")
        ImageDraw.Draw(image).text((8, 8), "no images were captioned", fill="black")
        return image
    columns = min(columns or math.ceil(math.sqrt(len(results))), len(results))
    rows = math.ceil(len(results) / columns)
    width_chars = max(8, tile // 6)  # the default font is about 6 px a character
    text_height = MAX_LINES * LINE_HEIGHT + 8
    sheet = Image.new("RGB", (columns * tile, rows * (tile + text_height)), "white")
    draw = ImageDraw.Draw(sheet)
    for i, result in enumerate(results):
        x, y = (i % columns) * tile, (i // columns) * (tile + text_height)
        image = open_image(result.image, keep_alpha=True)
        image.thumbnail((tile - 8, tile - 8))
        sheet.paste(on_checkerboard(image), (x + (tile - image.width) // 2, y + (tile - image.height) // 2))
        for n, line in enumerate(caption_lines(result, width_chars)):
            draw.text((x + 4, y + tile + 4 + n * LINE_HEIGHT), line, fill="black")
    return sheet
