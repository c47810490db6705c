"""Order of micro-batches: shuffled per epoch, one aspect bucket per micro-batch, fully reproducible.

An epoch's order is a pure function of (seed, epoch), and every epoch has the same number of micro-batches
(each bucket's sample count is fixed), so micro-batch m of the run is a pure function of (seed, m): the
only state to keep (and checkpoint) is the run's micro-batch counter, which the trainer keeps
(training/randomness.py draws from the same counter).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class DataOrder:
    def __init__(self, buckets: list[tuple[int, int]], repeats: int | Sequence[int], batch_size: int, seed: int):
        """`buckets[i]` is sample i's bucket; each epoch visits every sample `repeats` times (one number for
        all, or one per sample: datasets of several folders, each with its own repeats)."""
        self.buckets = list(buckets)
        self.repeats = repeats
        self.batch_size = batch_size
        self.seed = seed
        self._plan: tuple[int, list[list[int]]] | None = None  # (epoch, its micro-batches)

    def epoch_plan(self, epoch: int) -> list[list[int]]:
        """The micro-batches (lists of sample indices, each within one bucket) of `epoch`."""
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        counts = [self.repeats] * len(self.buckets) if isinstance(self.repeats, int) else self.repeats
        items = [i for i in range(len(self.buckets)) for _ in range(counts[i])]
        by_bucket: dict[tuple[int, int], list[int]] = {}
        for j in torch.randperm(len(items), generator=g).tolist():
            by_bucket.setdefault(self.buckets[items[j]], []).append(items[j])
        batches = [
            group[k:k + self.batch_size] for group in by_bucket.values() for k in range(0, len(group), self.batch_size)
        ]
        return [batches[k] for k in torch.randperm(len(batches), generator=g).tolist()]

    @property
    def batches_per_epoch(self) -> int:
        """The same in every epoch: each bucket's items split into ceil(count / batch_size) micro-batches."""
        counts = [self.repeats] * len(self.buckets) if isinstance(self.repeats, int) else self.repeats
        per_bucket: dict[tuple[int, int], int] = {}
        for bucket, count in zip(self.buckets, counts):
            per_bucket[bucket] = per_bucket.get(bucket, 0) + count
        return sum(-(-n // self.batch_size) for n in per_bucket.values() if n)

    def batch(self, m: int) -> list[int]:
        """The sample indices of micro-batch `m` (0-based, counted over the whole run)."""
        per_epoch = self.batches_per_epoch
        return self._epoch(m // per_epoch)[m % per_epoch]

    def _epoch(self, epoch: int) -> list[list[int]]:
        # One epoch's plan is kept: consecutive micro-batches are looked up in the same epoch.
        if self._plan is None or self._plan[0] != epoch:
            self._plan = (epoch, self.epoch_plan(epoch))
        return self._plan[1]
