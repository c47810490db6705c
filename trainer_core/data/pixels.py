"""Images as tensors and back: PIL RGB <-> (3, H, W) float in [-1, 1], the range the VAE takes and gives."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """PIL RGB -> (3, H, W) float in [-1, 1]."""
    array = np.asarray(img, dtype=np.float32) / 127.5 - 1.0  # (H, W, 3)
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def tensor_to_pil(image: torch.Tensor) -> Image.Image:
    """(3, H, W) in [-1, 1] -> PIL RGB."""
    array = ((image.float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(array)
