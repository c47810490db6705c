"""Images as tensors and back: PIL RGB (or RGBA) <-> (3 or 4, H, W) float in [-1, 1], the range the VAE takes and gives;
and transparency shown to a person (over a checkerboard, as image editors show it)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image


CHECKER = 8  # px: the squares of the checkerboard that transparency is shown on


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """PIL RGB (or RGBA) -> (3 (or 4), H, W) float in [-1, 1]."""
    array = np.asarray(img, dtype=np.float32) / 127.5 - 1.0  # (H, W, 3 or 4)
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def tensor_to_pil(image: torch.Tensor) -> Image.Image:
    """(3, H, W) in [-1, 1] -> PIL RGB."""
    array = ((image.float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(array)


def has_alpha(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info


def checkerboard(size: tuple[int, int], square: int = CHECKER) -> Image.Image:
    """(W, H) of white and light grey squares of `square` px, RGBA."""
    w, h = size
    board = Image.new("RGBA", size, (255, 255, 255, 255))
    grey = Image.new("RGBA", (square, square), (204, 204, 204, 255))
    for y in range(0, h, square):
        for x in range((y // square) % 2 * square, w, 2 * square):
            board.paste(grey, (x, y))
    return board


def on_checkerboard(image: Image.Image, square: int = CHECKER) -> Image.Image:
    """`image` for a person to look at, as RGB: one with transparency over a checkerboard (transparent pixels show
    the board, half-transparent ones a blend), an opaque one as it is."""
    if not has_alpha(image):
        return image.convert("RGB")
    return Image.alpha_composite(checkerboard(image.size, square), image.convert("RGBA")).convert("RGB")
