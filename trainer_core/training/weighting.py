"""Datasets' loss weights and the loss per dataset.

A micro-batch of B samples, sample i from a dataset of weight w_i, with l_i its flow loss (the MSE over its
tokens and channels), has the loss

    loss = (1/B) * sum_i w_i * l_i

(normalised by the count, not by the sum of the weights: a dataset of weight 0.5 counts half even in a
micro-batch of its own, as OneTrainer's per-concept loss weight multiplies the loss). A step's loss is the mean
over its micro-batches, so over micro-batches of equal size it is sum_d (n_d / S) * w_d * L_d: the per-dataset
mean losses L_d, each weighted by its weight and its share n_d / S of the step's S samples. When every weight is
1 the loss is computed as before weights existed (objective.flow_loss), bit for bit.

`DatasetLosses` tallies each dataset's mean (unweighted) l_i over a step for the loss report.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data.cache import CachedSample
from .masked_loss import masked_flow_loss
from .objective import flow_loss


def sample_weights(samples: list[CachedSample]) -> torch.Tensor | None:
    """(B,) fp32 loss weights of the samples; None when all are 1 (the unweighted loss applies, unchanged)."""
    weights = [s.loss_weight for s in samples]
    return None if all(w == 1.0 for w in weights) else torch.tensor(weights, dtype=torch.float32)


def per_sample_losses(prediction: torch.Tensor, target: torch.Tensor,
                      positions: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) fp32 loss l_i of each sample's prediction (B, N, p*p*C) against its target: the MSE, or with loss
    masks (`positions`, packed like the prediction: masked_loss.packed_weights) the mask-weighted mean of its
    squared errors."""
    err = (prediction.float() - target.float()).square().flatten(1)  # (B, N * p*p*C)
    if positions is None:
        return err.mean(dim=1)
    w = positions.to(err.device, torch.float32).flatten(1)
    return (err * w).sum(dim=1) / w.sum(dim=1)


def sample_weighted_loss(prediction: torch.Tensor, target: torch.Tensor, weights: torch.Tensor | None,
                         positions: torch.Tensor | None) -> torch.Tensor:
    """The loss of a micro-batch with datasets' weights (B,) or None and loss masks `positions` or None.

    No dataset weights: the flow loss, or with masks the mask-weighted mean over the whole micro-batch
    (masked_loss.masked_flow_loss), both as they are without weights, bit for bit. With dataset weights:
    (1/B) sum_i w_i l_i, each sample's l_i its own (masked) mean (`per_sample_losses`)."""
    if weights is None:
        return flow_loss(prediction, target) if positions is None else masked_flow_loss(prediction, target, positions)
    return (per_sample_losses(prediction, target, positions) * weights.to(prediction.device)).mean()


@dataclass
class DatasetLoss:
    """One dataset's part of a step (or of several: `merge`)."""

    mean: float  # mean of its samples' unweighted losses l_i
    samples: int  # how many of its samples the step had
    weight: float  # its loss weight
    regularization: bool


class DatasetLosses:
    """Each dataset's samples' losses over one step, for the report."""

    def __init__(self):
        self._sums: dict[str, list] = {}  # label -> [sum of l_i, count, weight, regularization]

    def add(self, samples: list[CachedSample], losses: torch.Tensor) -> None:
        """`losses` (B,): the samples' unweighted losses, in order."""
        for s, value in zip(samples, losses.detach().float().cpu().tolist()):
            entry = self._sums.setdefault(s.dataset, [0.0, 0, s.loss_weight, s.regularization])
            entry[0] += value
            entry[1] += 1

    def report(self) -> dict[str, DatasetLoss]:
        return {label: DatasetLoss(total / count, count, weight, reg)
                for label, (total, count, weight, reg) in self._sums.items()}


def record_dataset_losses(tally: DatasetLosses | None, step: int, history: list) -> dict[str, DatasetLoss] | None:
    """The step's per-dataset report (None when the report lists no datasets), its means appended to `history`
    as (step, {label: mean})."""
    datasets = tally.report() if tally is not None else None
    if datasets:
        history.append((step, {label: d.mean for label, d in datasets.items()}))
    return datasets


def reports_datasets(samples: list[CachedSample]) -> bool:
    """Whether the loss report lists datasets: more than one, or one that is weighted or regularises."""
    return len({s.dataset for s in samples}) > 1 or any(s.loss_weight != 1.0 or s.regularization for s in samples)


def describe(losses: dict[str, DatasetLoss]) -> str:
    """One line for a person: 'subject 0.1234, reg (regularisation, x0.5) 0.2345'."""
    parts = []
    for label, d in losses.items():
        notes = [*(["regularisation"] if d.regularization else []), *([f"x{d.weight:g}"] if d.weight != 1.0 else [])]
        note = " (" + ", ".join(notes) + ")" if notes else ""
        parts.append(f"{label}{note} {d.mean:.4f}")
    return ", ".join(parts)
