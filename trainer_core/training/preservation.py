"""Differential output preservation (ai-toolkit's DOP): keep the base model's picture of the class.

For the samples of a micro-batch whose caption has the trigger (their class captions were cached,
data/preservation.py), at the same noisy latent x_t and noise level s as their training rows:
    base    = the transformer with the adapter off (adapters.lora.adapter_disabled), no gradient
    adapted = the transformer with the adapter, gradient on, for the class caption
    term    = preservation_weight * (1/B) * sum_{i in P} MSE_i(adapted, base)
with P those samples and B the micro-batch's size (samples without the trigger add 0): the per-sample mean of the
training loss (training/weighting.py) extended by these P terms. The base forward runs first, alone; the adapted
rows ride in the training forward, after its B rows (one forward of B + P rows, one backward: the block runner's
checkpoint recompute and the swapper expect one training forward per backward). So a step with preservation runs
one more forward (no gradient, P rows) and a training forward of B + P rows; the memory plan and the timeline
model count both (planner/).

Both predictions take the sample's own conditions (the family's `conditions` hook: Edit's control images, appended
after the target's tokens), and its class caption was encoded beside them (the family's `text_key`), so a family
with conditions needs nothing of its own here (tests/families/test_edit_prior.py checks Edit against its pipelines' pieces).
"""

from __future__ import annotations

import torch

from ..adapters.lora import adapter_disabled
from ..data.cache import CachedSample


def preserved_rows(samples: list[CachedSample], weight: float) -> list[int]:
    """Indices of the samples that take part (none when the weight is 0: preservation is off)."""
    return [i for i, s in enumerate(samples) if s.preservation_text_key] if weight > 0 else []


def base_prediction(transformer: torch.nn.Module, predict, *inputs) -> torch.Tensor:
    """`predict(*inputs)` with the adapter off and no gradient: the base model's prediction."""
    with torch.no_grad(), adapter_disabled(transformer):
        return predict(*inputs)


def preservation_loss(adapted: torch.Tensor, base: torch.Tensor, batch_size: int, weight: float) -> torch.Tensor:
    """weight * (1/B) * sum over the P rows of their MSE, for predictions (P, N, 4C) at equal shapes (one bucket:
    every row has the same N, so the mean over all P rows' elements times P / B is that sum)."""
    rows = adapted.shape[0]
    return weight * torch.nn.functional.mse_loss(adapted.float(), base.float()) * (rows / batch_size)


def check_cached(samples: list[CachedSample], weight: float) -> None:
    """Refuse preservation that could not run: a weight, but a cache without class captions."""
    from ..core.errors import UserInputError

    if weight > 0 and not any(s.preservation_text_key for s in samples):
        raise UserInputError(
            f"preservation_weight={weight:g} but the cached dataset has no class captions: set preservation_trigger "
            "and preservation_class on the Cache node ([cache] in a run file) and cache again, or set "
            "preservation_weight to 0.")
