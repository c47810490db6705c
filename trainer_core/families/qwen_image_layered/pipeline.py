"""The pinned `QwenImageLayeredPipeline` as the one source of what a Layered model is fed.

What the pipeline's `__call__` does, and which of its own pieces we call for it:
- prompt: text only, the text-to-image template (`encode_prompt`, with the `__call__`'s default
  `max_sequence_length`); an empty prompt at inference is captioned by the VL model instead, so the
  empty caption (caption dropout) is encoded as it is;
- images: RGBA in [-1, 1] (`image_processor.preprocess` of an RGBA image, `do_convert_rgb` off), each frame
  VAE-encoded alone (`_encode_vae_image`: distribution mode, the VAE config's statistics);
- noisy latents: F = layers + 1 frames (frame 0 the composite, then the layers), packed frame after frame
  (`_pack_latents`), the composite's clean latents packed after them as the condition;
- `img_shapes`: F + 1 entries (1, h/2, w/2), the last the condition's (layer-3D RoPE puts it at frame -1);
- timestep: t / 1000 = the noise level s; `additional_t_cond` = 0 for every sample (`is_rgb`);
- schedule: sigmas linspace(1, 0, steps + 1)[:-1] shifted with mu = sqrt(condition tokens / 256) (its
  `base_seqlen = 256 * 256 / 16 / 16`), which the training's resolution shift uses too;
- output: all F frames are predicted; the composite frame is dropped only when decoding.

`prompt_template_encode_start_idx` (34 for the real tokenizer) is derived with our tokenizer
(`models.text.template_prefix_length`), as the Edit family does.
"""

from __future__ import annotations

import functools
import inspect
import math

import torch

from ...models.qwen_arch import PATCH_SIZE

BASE_SEQ_LEN = 256 * 256 / 16 / 16  # the pipeline's `base_seqlen`: condition tokens of a 256² px image
RGB_FLAG = 0  # the pipeline's `is_rgb`: the value `additional_t_cond` takes for every sample


class _EncoderDtype:
    """Stands in for the text encoder where the pipeline reads only its dtype (to cast the preview's
    composite); the prompt embeddings are given, so the encoder itself is never called."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype


def layered_pipeline(components, transformer=None, scheduler=None, encoder: bool = True):
    """`QwenImageLayeredPipeline` around our VAE (and text encoder and tokenizer when `encoder`; they must be
    loaded then; else a dtype stand-in)."""
    from diffusers import QwenImageLayeredPipeline

    from ...models.text import template_prefix_length

    text_encoder = components.text_encoder if encoder else _EncoderDtype(components.compute_dtype)
    tokenizer = components.tokenizer if encoder else None
    pipe = QwenImageLayeredPipeline(scheduler=scheduler, vae=components.vae, text_encoder=text_encoder,
                                    tokenizer=tokenizer, processor=None, transformer=transformer)
    if tokenizer is not None:
        pipe.prompt_template_encode_start_idx = template_prefix_length(tokenizer, pipe.prompt_template_encode)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@functools.lru_cache(maxsize=1)
def prompt_template() -> str:
    """The pipeline's prompt template (a value its __init__ sets)."""
    from diffusers import QwenImageLayeredPipeline

    empty = QwenImageLayeredPipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, processor=None,
                                     transformer=None)
    return empty.prompt_template_encode


def max_sequence_length() -> int:
    from diffusers import QwenImageLayeredPipeline

    return inspect.signature(QwenImageLayeredPipeline.__call__).parameters["max_sequence_length"].default


@torch.no_grad()
def encode_prompt(pipe, prompt: str, device) -> torch.Tensor:
    """(L, D) embedding of one prompt, as the pipeline's `__call__` encodes it (one prompt: no padding)."""
    embeds, _mask = pipe.encode_prompt(prompt, device=device, max_sequence_length=max_sequence_length())
    return embeds[0].clone()


@torch.no_grad()
def encode_frames(pipe, images, dtype: torch.dtype) -> torch.Tensor:
    """RGBA PIL images of one size (composite first, then the layers) -> latents (C, F, h, w) fp32, each
    frame preprocessed and encoded alone by the pipeline's own pieces."""
    device = next(pipe.vae.parameters()).device
    frames = []
    for image in images:
        pixels = pipe.image_processor.preprocess(image, image.height, image.width)  # (1, 4, H, W) in [-1, 1]
        frames.append(pipe._encode_vae_image(pixels.unsqueeze(2).to(device, dtype), generator=None)[0].float())
    return torch.cat(frames, dim=1)  # (C, F, h, w)


def condition_mu(condition_tokens: int) -> float:
    """The pipeline's mu for the schedule: sqrt(condition tokens / BASE_SEQ_LEN)."""
    return math.sqrt(condition_tokens / BASE_SEQ_LEN)


def pack_frames(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, F, h, w) -> (B, F * h/2 * w/2, 4C), frame after frame, as the pipeline's `_pack_latents`."""
    from diffusers import QwenImageLayeredPipeline

    b, c, f, h, w = latents.shape
    return QwenImageLayeredPipeline._pack_latents(latents.permute(0, 2, 1, 3, 4), b, c, h, w, f)


def frame_shapes(frames: int, grid: tuple[int, int]) -> list[tuple[int, int, int]]:
    """`img_shapes` of one sample: each of the F frames, then the condition image, all (1, h/2, w/2)."""
    return [(1, *grid)] * (frames + 1)


def frame_grid(latent_shape) -> tuple[int, int, int]:
    """(F, h/2, w/2) of latents (B, C, F, h, w)."""
    f, h, w = latent_shape[-3:]
    return f, h // PATCH_SIZE, w // PATCH_SIZE
