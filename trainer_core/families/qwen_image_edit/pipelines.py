"""The pinned diffusers edit pipelines as the one source of what an edit model is fed.

Nothing about the edit prompt or the control images is retyped here: the prompt templates ("Picture N: "
slots for Edit-Plus), the image sizing rule (`calculate_dimensions`, `CONDITION_IMAGE_SIZE`,
`VAE_IMAGE_SIZE`), the resizing (the pipeline's `image_processor`), the prompt encoding with images
(`encode_prompt`) and the control latents (`_encode_vae_image`) are the pipeline's own, called on a pipeline
object built around our parts. The constants are read when used, not when imported, so a test that runs
the pipeline at a small size (by setting those constants) runs us at the same size.

Two facts the pipelines hard-code for the real tokenizer and model are derived instead:
- the count of template tokens dropped from the encoder's output (`prompt_template_encode_start_idx`, 64
  with the real tokenizer): the tokens of the template up to the user's turn, counted with our tokenizer by
  `models.text.template_prefix_length`, the one text-to-image uses too (a tiny test tokenizer gives another
  number; tests check 64 with ComfyUI's real tokenizer);
- Edit (v1) sizes its control to 1024 * 1024 px of area written as a literal in its `__call__`: the same
  number the Edit-Plus module names `VAE_IMAGE_SIZE`, which is read here for both.

Sizes: an image of W x H px becomes a VAE image of about VAE_IMAGE_SIZE px of area (sides multiples of 32)
and, for Edit-Plus, an encoder image of about CONDITION_IMAGE_SIZE px (Edit v1 gives the encoder the VAE
image). `control_resolution` scales both areas by control_resolution² / VAE_IMAGE_SIZE: tiny models on a
CPU cannot afford 1024² controls; None keeps the model's own rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from PIL import Image

from ...core.errors import UserInputError
from ...models.vision_processor import processor_refusal
from .variants import EditVariant

# An image whose sized aspect ratio is off from its own by more than this factor cannot be matched on the
# 32 px grid at that area (a very thin image at a small control resolution).
MAX_ASPECT_DISTORTION = 1.25


def _modules():
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as v1
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

    return v1, plus


def pipeline_class(variant: EditVariant):
    import diffusers

    return getattr(diffusers, variant.pipeline)


def edit_pipeline(variant: EditVariant, components, transformer=None, scheduler=None, encoder: bool = True):
    """The variant's diffusers pipeline around our VAE (and text encoder, tokenizer and processor when
    `encoder`; they must be loaded then)."""
    from ...models.text import template_prefix_length
    from .processor import build_processor

    text_encoder = tokenizer = processor = None
    if encoder:
        text_encoder, tokenizer = components.text_encoder, components.tokenizer
        visual = getattr(getattr(text_encoder, "model", None), "visual", None)
        if visual is None:
            raise UserInputError(
                "the text encoder was loaded without its vision tower, which Qwen-Image-Edit needs to see the control "
                "images. Load it for an edit model (ComfyUI's qwen_2.5_vl_7b_fp8_scaled.safetensors carries it, as "
                "visual.*; or a diffusers Qwen-Image-Edit folder).")
        processor = build_processor(tokenizer, text_encoder.config.vision_config)
    pipe = pipeline_class(variant)(scheduler=scheduler, vae=components.vae, text_encoder=text_encoder,
                                   tokenizer=tokenizer, processor=processor, transformer=transformer)
    if tokenizer is not None:
        pipe.prompt_template_encode_start_idx = template_prefix_length(tokenizer, pipe.prompt_template_encode)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# --------------------------------------------------------------------------------------------------
# sizing

@dataclass(frozen=True)
class ControlSize:
    vae: tuple[int, int]  # (width, height) of the VAE image in px, multiples of 32
    condition: tuple[int, int]  # (width, height) of the image the text encoder sees


def control_size(variant: EditVariant, width: int, height: int, control_resolution: int | None = None) -> ControlSize:
    """Sizes of a control image of `width` x `height` px under the variant's rule (module docstring)."""
    v1, plus = _modules()
    scale = 1.0 if not control_resolution else control_resolution**2 / plus.VAE_IMAGE_SIZE
    ratio = width / height
    if variant.multi_image:
        vae = plus.calculate_dimensions(plus.VAE_IMAGE_SIZE * scale, ratio)
        condition = plus.calculate_dimensions(plus.CONDITION_IMAGE_SIZE * scale, ratio)
    else:
        vae = v1.calculate_dimensions(plus.VAE_IMAGE_SIZE * scale, ratio)[:2]  # (width, height, None)
        condition = vae
    return ControlSize(vae=(int(vae[0]), int(vae[1])), condition=(int(condition[0]), int(condition[1])))


def encoder_view(variant: EditVariant, vae: tuple[int, int]) -> tuple[int, int]:
    """The encoder image `control_size` gives beside a VAE image of `vae` (W, H) px: Edit-Plus sizes both by one
    scale (CONDITION_IMAGE_SIZE / VAE_IMAGE_SIZE of the area) at one aspect ratio, here the VAE image's (its sides
    are rounded to 32 px, so a side may differ from the cache's by the rounding); Edit v1 shows the encoder the VAE's."""
    if not variant.multi_image:
        return vae
    _, plus = _modules()
    w, h = plus.calculate_dimensions(vae[0] * vae[1] * plus.CONDITION_IMAGE_SIZE / plus.VAE_IMAGE_SIZE, vae[0] / vae[1])
    return int(w), int(h)


def processor_view(size: tuple[int, int]) -> tuple[int, int]:
    """(W, H) px the Qwen2.5-VL processor resizes a (W, H) encoder image to (its own 28 px grid and pixel bounds)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    from .processor import QWEN25_VL_MAX_PIXELS, QWEN25_VL_MIN_PIXELS

    h, w = smart_resize(size[1], size[0], factor=28, min_pixels=QWEN25_VL_MIN_PIXELS, max_pixels=QWEN25_VL_MAX_PIXELS)
    return int(w), int(h)


def check_control_aspect(name: str, width: int, height: int, size: ControlSize, control_resolution: int | None) -> None:
    """A control whose aspect ratio its VAE image cannot keep is refused by name (the VAE image makes the control
    tokens and their positions). The text encoder's smaller view is only required to exist: the processor
    resizes it again to its own 28 px grid."""
    setting = 'the model default' if not control_resolution else f'control_resolution {control_resolution}'
    checks = (("VAE", size.vae, MAX_ASPECT_DISTORTION), ("text encoder", size.condition, math.inf))
    for what, (w, h), tolerance in checks:
        if w < 32 or h < 32 or abs(math.log((w / h) / (width / height))) > math.log(tolerance):
            raise UserInputError(
                f"control image {name} is {width}x{height} px: at the {what} image size of the edit model's rule "
                f"({setting}) it would be {w}x{h} px, which cannot keep its aspect ratio. Crop it to a less extreme "
                "aspect ratio" + (" or raise control_resolution." if control_resolution else "."))
    refusal = processor_refusal(*size.condition)  # what the text encoder's image processor would raise on
    if refusal is not None:
        w, h = size.condition
        raise UserInputError(
            f"control image {name} is {width}x{height} px: the text encoder's image processor refuses it at {w}x{h} px "
            f"({setting}): {refusal}. Crop it to an aspect ratio under 200:1.")


@dataclass
class PreparedControl:
    condition: Image.Image  # what the text encoder's processor receives
    pixels: torch.Tensor  # (1, 3, H, W) in [-1, 1]: what the VAE encodes
    size: ControlSize


def prepare_control(variant: EditVariant, pipe, image: Image.Image, control_resolution: int | None = None) -> PreparedControl:
    """Resize one RGB control image as the variant's pipeline does (its own image processor)."""
    size = control_size(variant, image.width, image.height, control_resolution)
    (vw, vh), (cw, ch) = size.vae, size.condition
    if variant.multi_image:
        condition = pipe.image_processor.resize(image, ch, cw)
        pixels = pipe.image_processor.preprocess(image, vh, vw)
    else:  # Edit v1 resizes once and gives the same image to both
        condition = pipe.image_processor.resize(image, vh, vw)
        pixels = pipe.image_processor.preprocess(condition, vh, vw)
    return PreparedControl(condition=condition, pixels=pixels, size=size)


# --------------------------------------------------------------------------------------------------
# encoding

@torch.no_grad()
def encode_edit_prompt(variant: EditVariant, pipe, prompt: str, conditions: list[Image.Image], device) -> torch.Tensor:
    """(L, D) embedding of `prompt` with its control images, exactly as the pipeline encodes it."""
    images = conditions if variant.multi_image else conditions[0]
    embeds, _mask = pipe.encode_prompt(prompt, image=images, device=device)  # (1, L, D); one prompt: no padding
    return embeds[0].clone()


@torch.no_grad()
def encode_control_latents(pipe, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(1, 3, H, W) pixels -> normalised latents (C, H/f, W/f), fp32, by the pipeline's own VAE encoding
    (distribution mode, the VAE config's statistics). `dtype`: what the pipeline casts images to (its
    prompt embeddings' dtype: the compute dtype)."""
    device = next(pipe.vae.parameters()).device
    latents = pipe._encode_vae_image(pixels.unsqueeze(2).to(device, dtype), generator=None)  # (1, C, 1, h, w)
    return latents[0, :, 0].float()
