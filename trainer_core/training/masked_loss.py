"""The masked flow loss: the MSE weighted per latent position, its mean taken over the weights.

    loss = sum(w * (prediction - target)^2) / sum(w)

over every element of the micro-batch's packed target tokens (B, N, 4C). The weights are the samples' loss
masks on the latent grid (data/masks.py, cached as (h, w) per sample; a sample without a mask weighs 1
everywhere), broadcast over the C latent channels and packed 2x2 exactly as the latents are
(models/latents.pack_latents), so each element of a token carries the weight of its own latent position.

A mask of all ones equals no mask bit for bit: the weighted mean is computed as mean(w * err) * (n / sum(w)),
which with w = 1 is mse_loss's own mean times exactly 1.0 (n / n), in forward and backward.
"""

from __future__ import annotations

import torch

from ..data.cache import CachedDataset, CachedSample
from ..models.latents import pack_latents


def batch_weights(dataset: CachedDataset, samples: list[CachedSample], grid: tuple[int, int]) -> torch.Tensor | None:
    """(B, h, w) fp32 loss weights of a micro-batch whose latents have the grid (h, w), or None when no sample
    of it has a mask (the plain mean applies)."""
    if not any(s.mask_key for s in samples):
        return None
    ones = torch.ones(grid, dtype=torch.float32)
    return torch.stack([dataset.mask_weights(s.mask_key) if s.mask_key else ones for s in samples])


def packed_weights(weights: torch.Tensor, latent_shape: tuple[int, ...], pack=pack_latents) -> torch.Tensor:
    """(B, h, w) weights -> (B, N, p*p*C), element for element as `pack` (the family's: models.latents
    pack_latents by default) lays out latents of `latent_shape`: (B, C, h, w), or Layered's (B, C, F, h, w), whose
    frames (the composite and its layers, aligned pixel for pixel) its one mask weighs alike."""
    b, h, w = weights.shape
    return pack(weights.view(b, *([1] * (len(latent_shape) - 3)), h, w).expand(*latent_shape))


def masked_flow_loss(prediction: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum(w * err) / sum(w) in fp32, for prediction, target and weights of one shape (B, N, 4C)."""
    err = torch.nn.functional.mse_loss(prediction.float(), target.float(), reduction="none")
    # n / sum(w) in float64 on the CPU (exact for n ones: 1.0; no float64 needed on the device), a true division
    # (a Python number divided by a tensor multiplies by its reciprocal, which is not exact)
    total = weights.detach().cpu().sum(dtype=torch.float64)
    scale = torch.div(torch.tensor(float(weights.numel()), dtype=torch.float64), total).float()
    return (err * weights.to(err.device, torch.float32)).mean() * scale
