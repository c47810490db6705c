"""VAE latents: encode, per-channel normalisation, and the 2x2 packing the transformer consumes.

Shapes: images (B, 3, H, W) in [-1, 1]; latents (B, C, h, w) with C = vae z_dim and h = H / f,
f = 2 ** len(vae.temperal_downsample) (8 for Qwen-Image); packed (B, h/2 * w/2, 4C): 2 x 2 latent cells
per token (`qwen_arch.PATCH_SIZE`).
"""

from __future__ import annotations

import contextlib

import torch

from .qwen_arch import PATCH_SIZE


def vae_scale_factor(vae) -> int:
    return 2 ** len(vae.config.temperal_downsample)


def latent_channels(vae) -> int:
    return vae.config.z_dim


def pixel_multiple(vae) -> int:
    """Image sides must be multiples of this: the VAE's downscale times the 2x2 patch."""
    return vae_scale_factor(vae) * PATCH_SIZE


def _stats(vae, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (1, latent_channels(vae), 1, 1)
    mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32).view(shape).to(like.device)
    std = torch.tensor(vae.config.latents_std, dtype=torch.float32).view(shape).to(like.device)
    return mean, std


@contextlib.contextmanager
def _computing_dtype(vae):
    """The dtype the VAE computes in: its own, except a bf16/fp16 VAE on the CPU, which computes in float32 for
    the call and is cast back after (exact: every half value is a float32 value). The CPU has no fast kernel
    for half-precision 3-D convolutions: the tiny VAE's encode took ~30x longer in bf16 than in float32."""
    param = next(vae.parameters())
    upcast = param.device.type == "cpu" and param.dtype in (torch.bfloat16, torch.float16)
    if upcast:
        torch.nn.Module.to(vae, torch.float32)  # the Module method: diffusers' own .to() warns about kept-fp32 modules
    try:
        yield torch.float32 if upcast else param.dtype
    finally:
        if upcast:
            torch.nn.Module.to(vae, param.dtype)


@torch.no_grad()
def encode_images(vae, images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) in [-1, 1] -> normalised latents (B, C, H/f, W/f) in fp32 (distribution mode)."""
    device = next(vae.parameters()).device
    if getattr(vae.config, "in_channels", 3) == 4 and images.shape[1] == 3:
        # an RGBA VAE (Qwen-Image 2.1's): an RGB image is opaque, as its pipeline's convert("RGBA") makes it
        images = torch.cat([images, torch.ones_like(images[:, :1])], dim=1)
    with _computing_dtype(vae) as dtype:
        video = images.to(device, dtype).unsqueeze(2)  # (B, 3 or 4, 1, H, W): the VAE works on frames
        latents = vae.encode(video).latent_dist.mode()[:, :, 0].float()  # (B, C, h, w)
    mean, std = _stats(vae, latents)
    return (latents - mean) / std


@torch.no_grad()
def decode_latents(vae, latents: torch.Tensor) -> torch.Tensor:
    """Normalised latents (B, C, h, w) -> images (B, 3, H, W) in [-1, 1], fp32."""
    device = next(vae.parameters()).device
    mean, std = _stats(vae, latents)
    with _computing_dtype(vae) as dtype:
        raw = (latents.float() * std + mean).to(device, dtype).unsqueeze(2)
        return vae.decode(raw).sample[:, :, 0].float().clamp(-1, 1)


def pack_latents(latents: torch.Tensor, p: int = PATCH_SIZE) -> torch.Tensor:
    """(B, C, h, w) -> (B, h/p * w/p, p*p*C): each p x p patch becomes one token, channels major (Qwen-Image:
    p = 2; Qwen-Image 2.1 takes every cell as a token, p = 1, its pipeline's `_pack_latents`)."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)  # (B, h/2, w/2, C, 2, 2)
    return x.reshape(b, (h // p) * (w // p), c * p * p)


def unpack_latents(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(B, h/2 * w/2, 4C) -> (B, C, h, w), the inverse of `pack_latents`."""
    b, _, c4 = tokens.shape
    p = PATCH_SIZE
    x = tokens.view(b, h // p, w // p, c4 // (p * p), p, p).permute(0, 3, 1, 4, 2, 5)  # (B, C, h/2, 2, w/2, 2)
    return x.reshape(b, c4 // (p * p), h, w)
