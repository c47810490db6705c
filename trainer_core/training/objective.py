"""Flow-matching objective of Qwen-Image, as pure functions.

x_t = (1 - s) x0 + s e,   target = e - x0,   loss = MSE(prediction, target) in fp32,
with the noise level s in (0, 1) drawn logit-normal or uniform and then shifted by image size the way
Qwen-Image's scheduler shifts its inference schedule (exponential time shift with
mu = calculate_shift(image tokens) of the pinned diffusers pipeline). The transformer is given s itself
as its timestep, as the pipeline does (it passes t / 1000 with t = 1000 s).
"""

from __future__ import annotations

import math

import torch

from ..models.scheduler import resolution_mu  # noqa: F401  (the step's and the evaluation's)


def time_shift(s: torch.Tensor, mu: float) -> torch.Tensor:
    """Exponential time shift (the scheduler's `time_shift_type='exponential'`): e^mu / (e^mu + 1/s - 1)."""
    return math.exp(mu) / (math.exp(mu) + (1.0 / s - 1.0))


def sample_noise_levels(
    batch: int,
    generator: torch.Generator,
    sampling: str,
    logit_mean: float = 0.0,
    logit_std: float = 1.0,
    mu: float | None = None,
) -> torch.Tensor:
    """(batch,) fp32 noise levels in (0, 1), drawn on the CPU from `generator` (device-independent)."""
    if sampling == "logit_normal":
        s = torch.sigmoid(torch.randn(batch, generator=generator) * logit_std + logit_mean)
    elif sampling == "uniform":
        s = torch.rand(batch, generator=generator)
    else:
        raise ValueError(f"unknown timestep sampling {sampling!r}")
    s = s.clamp(1e-5, 1.0 - 1e-5)
    return time_shift(s, mu) if mu is not None else s


def noisy_latents(x0: torch.Tensor, noise: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x_t for latents (B, ...) and levels s (B,)."""
    s = s.view(-1, *([1] * (x0.dim() - 1))).to(x0.dtype)
    return (1.0 - s) * x0 + s * noise


def velocity_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    return noise - x0


def flow_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(prediction.float(), target.float())
