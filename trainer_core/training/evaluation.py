"""The validation loss: how well the adapter predicts held-out images, the same number for the same LoRA.

Each held-out sample is scored at the fixed noise levels VALIDATION_LEVELS (shifted by image size like
training's when resolution_shift is on), with noise from a generator seeded per sample. Nothing of training's
state is touched: no gradients, LoRA dropout off while it runs, and training's draws come from counters
(randomness.py), which validation does not advance.
"""

from __future__ import annotations

import math

import torch

from .masked_loss import batch_weights
from .objective import time_shift
from .optim import evaluation_weights
from .step import FlowMatchingStep

# The fixed noise levels (before the resolution shift), spread over (0, 1), and the seed of the fixed noise
# (sample i draws from a generator seeded VALIDATION_SEED + i).
VALIDATION_LEVELS = (0.1, 0.3, 0.5, 0.7, 0.9)
VALIDATION_SEED = 20251130


def validation_loss(flow: FlowMatchingStep, optimizer: torch.optim.Optimizer) -> float:
    """Mean flow loss over the held-out samples of `flow`'s dataset (NaN without any), by its transformer, with its
    settings and family; scored at the weights `optimizer` evaluates at."""
    samples = flow.dataset.validation
    if not samples:
        return math.nan
    transformer, dataset, family = flow.transformer, flow.dataset, flow.family
    was_training = transformer.training
    transformer.eval()
    total = 0.0
    try:
        # schedule-free AdamW is scored at its averaged weights, the ones a saved LoRA holds
        with torch.no_grad(), evaluation_weights(optimizer):
            for index, sample in enumerate(samples):
                x0 = dataset.latents(sample.latent_key).float()  # (C, h, w)
                k = len(VALIDATION_LEVELS)
                generator = torch.Generator().manual_seed(VALIDATION_SEED + index)
                noise = torch.randn((k, *x0.shape), generator=generator)  # (K, C, h, w)
                levels = torch.tensor(VALIDATION_LEVELS, dtype=torch.float32)  # (K,)
                if flow.cfg.resolution_shift:
                    mu = family.resolution_mu((k, *x0.shape), flow.scheduler_config)
                    levels = time_shift(levels, mu)
                embeds = [dataset.embedding(sample.text_key)] * k
                conditions = family.conditions(dataset, [sample] * k)
                weights = batch_weights(dataset, [sample] * k, tuple(x0.shape[-2:]))  # its loss mask, as in training
                total += float(flow.flow_loss(x0.expand(k, *x0.shape).contiguous(), noise, levels, embeds,
                                              conditions, weights, text_keys=[sample.text_key] * k))
    finally:
        transformer.train(was_training)
    return total / len(samples)
