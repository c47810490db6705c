"""Pieces every node uses: the category, the engine context, IMAGE conversion."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from PIL import Image

CATEGORY = "Qwen-Image LoRA training"

# Custom socket types passed between our nodes.
MODELS = "QWEN_LORA_MODELS"
DATASET = "QWEN_LORA_DATASET"
CACHED = "QWEN_LORA_CACHED_DATASET"
LORA_CONFIG = "QWEN_LORA_CONFIG"
OPTIMIZER_CONFIG = "QWEN_LORA_OPTIMIZER"
TRAINER = "QWEN_LORA_TRAINER"


@contextlib.contextmanager
def engine_mode():
    """ComfyUI runs nodes under torch.inference_mode(); tensors made there can never join autograd.
    Everything our nodes create (models, adapters, optimizer state) is made with it switched off."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


def pil_to_image(img: Image.Image) -> torch.Tensor:
    """PIL -> ComfyUI IMAGE (1, H, W, 3) float32 in [0, 1]."""
    return torch.from_numpy(np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0).unsqueeze(0)


def pil_to_image_and_mask(img: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
    """PIL -> (IMAGE (1, H, W, 3), MASK (1, H, W)) as ComfyUI's Load Image node gives them: the colour channels as they
    are, and the mask 1 where the picture is transparent (1 - alpha); an opaque picture's mask is all 0."""
    rgba = np.asarray(img.convert("RGBA"), dtype=np.float32) / 255.0  # (H, W, 4)
    image = torch.from_numpy(np.ascontiguousarray(rgba[..., :3])).unsqueeze(0)
    mask = torch.from_numpy(np.ascontiguousarray(1.0 - rgba[..., 3])).unsqueeze(0)
    return image, mask


def image_to_pil(image: torch.Tensor) -> Image.Image:
    """ComfyUI IMAGE (B, H, W, C) in [0, 1] -> PIL RGB of its first image."""
    array = (image[0, :, :, :3].float().clamp(0, 1) * 255).round().byte().cpu().numpy()
    return Image.fromarray(array)
