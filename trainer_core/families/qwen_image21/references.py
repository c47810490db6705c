"""Reference images of Qwen-Image 2.1, by the pinned `QwenImage21Pipeline`'s own pieces.

For an image-conditioned call the pipeline (`__call__` step 1, `_get_qwen_prompt_embeds`, `prepare_latents`):
- sizes every reference to about `output_resolution`² px of area, keeping its aspect ratio, sides multiples of
  32 (`calculate_dimensions`; `output_resolution` defaults to 1024);
- gives the text encoder the image resized to that size (`image_processor.resize` of its RGBA copy, composited
  over white), as vision tokens in the image template's "<image1><|vision_start|><|image_pad|>...<|vision_end|>"
  slot before the prompt, one `<|image_pad|>` per 32 x 32 px (one per 2 x 2 latent cells);
- gives the VAE the same size (`image_processor.preprocess`, RGBA, in [-1, 1]) and puts its normalised latents,
  packed one token per cell, before the noisy target's tokens; the transformer drops those tokens into the
  prompt's image slots (block-causal attention, modulated at t = 0).
Everything below calls those pieces on a pipeline around our parts; nothing of them is retyped. The one rule
derived, not called: Qwen3-VL's processor enlarges an image under its minimum pixel count (256 x 256 px), which
would give more vision tokens than the reference has latent slots; such a size is refused by name.

Shapes: a reference of W x H px -> pixels (1, 4, H, W), latents (C, H/16, W/16), H/32 * W/32 image slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from PIL import Image

from ...core.errors import UserInputError
from ...models.vision_processor import processor_refusal

# The pipeline's default `output_resolution`: the side of the square whose area a reference is sized to.
DEFAULT_RESOLUTION = 1024
# A reference whose sized aspect ratio is off from its own by more than this factor is refused (as Edit's controls).
MAX_ASPECT_DISTORTION = 1.25


def reference_size(width: int, height: int, resolution: int = 0) -> tuple[int, int]:
    """(W, H) px a `width` x `height` reference is sized to by the pipeline at `resolution` (0: its default)."""
    from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_dimensions

    side = resolution or DEFAULT_RESOLUTION
    w, h, _ = calculate_dimensions(side * side, width / height)
    return int(w), int(h)


def check_reference_size(name: str, width: int, height: int, resolution: int) -> tuple[int, int]:
    """The reference's size (`reference_size`), refused by name when the pipeline's sizing cannot keep its aspect
    ratio or Qwen3-VL would resize it again (under its minimum pixels: more vision tokens than latent slots)."""
    from .processor import MIN_PIXELS

    w, h = reference_size(width, height, resolution)
    setting = f"control_resolution {resolution}" if resolution else f"the pipeline's default {DEFAULT_RESOLUTION}"
    if w < 32 or h < 32 or abs(math.log((w / h) / (width / height))) > math.log(MAX_ASPECT_DISTORTION):
        raise UserInputError(f"reference image {name} is {width}x{height} px: sized for Qwen-Image 2.1 ({setting}) it "
                             f"would be {w}x{h} px, which cannot keep its aspect ratio. Crop it to a less extreme "
                             "aspect ratio or raise control_resolution.")
    refusal = processor_refusal(w, h)  # what Qwen3-VL's image processor would raise on
    if refusal is not None:
        raise UserInputError(f"reference image {name} is {width}x{height} px: Qwen3-VL's image processor refuses it "
                             f"sized for Qwen-Image 2.1 ({setting}) to {w}x{h} px: {refusal}. Crop it to an aspect "
                             "ratio under 200:1.")
    if w * h < MIN_PIXELS:
        raise UserInputError(f"reference image {name} would be {w}x{h} px ({setting}), under the {MIN_PIXELS} px "
                             f"Qwen3-VL's processor enlarges smaller images to (so its vision tokens would not match "
                             "its latents): set control_resolution to 0 or to 256 and more.")
    return w, h


def reference_pipeline(components, encoder: bool = True):
    """A `QwenImage21Pipeline` around our VAE (and text encoder and processor when `encoder`), no transformer."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline

    processor = components.tokenizer if components.tokenizer is not None else components.processor_loader()
    pipe = QwenImage21Pipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config),
                               vae=components.vae, text_encoder=components.text_encoder if encoder else None,
                               processor=processor, transformer=None)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@dataclass
class PreparedReference:
    encoder_image: Image.Image  # RGBA at the sized size: what the pipeline hands its prompt encoding
    pixels: torch.Tensor  # (1, 4, H, W) in [-1, 1]: what its VAE encodes
    size: tuple[int, int]  # (W, H) px


def prepare_reference(pipe, image: Image.Image, size: tuple[int, int]) -> PreparedReference:
    """One reference resized as `__call__` does (its RGBA copy; its own image processor), to `size` (W, H)."""
    rgba = image if image.mode == "RGBA" else image.convert("RGBA")
    w, h = size
    return PreparedReference(encoder_image=pipe.image_processor.resize(rgba, width=w, height=h),
                             pixels=pipe.image_processor.preprocess(rgba, width=w, height=h), size=size)


@torch.no_grad()
def encode_reference_prompt(pipe, prompt: str, references: list[PreparedReference], device, names: list[str]
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(embedding (L, D), image slots (L,) bool) of `prompt` seen with `references`, by the pipeline's
    `encode_prompt` (one prompt: no padding). `names` name the references in an error."""
    embeds, _mask, slots = pipe.encode_prompt(prompt, image=[r.encoder_image for r in references], device=device)
    expected = sum((r.size[0] // 32) * (r.size[1] // 32) for r in references)
    if int(slots.sum()) != expected:
        raise UserInputError(
            f"the text encoder gave {int(slots.sum())} vision tokens for reference images {', '.join(names)}, but "
            f"their latents fill {expected} slots (one per 32 x 32 px): its processor resized them again. Use a "
            "control_resolution of 256 or more (or 0).")
    return embeds[0].clone(), slots[0].clone()


@torch.no_grad()
def encode_reference_latents(pipe, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(1, 4, H, W) pixels -> normalised latents (C, H/16, W/16) fp32 by the pipeline's `_encode_vae_image`
    (distribution mode), the image cast to `dtype` first as `prepare_latents` does (the prompt's dtype)."""
    device = next(pipe.vae.parameters()).device
    latents = pipe._encode_vae_image(pixels.unsqueeze(2).to(device, dtype), generator=None)  # (1, C, 1, h, w)
    return latents[0, :, 0].float()


def reference_tokens(references: list[torch.Tensor]) -> torch.Tensor:
    """Reference latents [(C, h_i, w_i)] -> their tokens (1, sum h_i * w_i, C), in order, as `prepare_latents`
    packs them (patch 1: a spatial flatten)."""
    from ...models.latents import pack_latents

    return torch.cat([pack_latents(r.unsqueeze(0), 1) for r in references], dim=1)


def reference_shapes(references: list[torch.Tensor]) -> list[tuple[int, int, int]]:
    """`img_shapes` entries of reference latents [(C, h_i, w_i)]: (1, h_i, w_i) each, before the target's."""
    return [(1, r.shape[-2], r.shape[-1]) for r in references]
