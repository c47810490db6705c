"""Order of micro-batches: shuffled per epoch, one aspect bucket per micro-batch, fully reproducible.

An epoch's order is a pure function of (seed, epoch), so the only state to keep (and checkpoint) is
the position: (epoch, index of the next micro-batch in that epoch).
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
        self.epoch = 0
        self.position = 0
        self._plan: list[list[int]] | None = None

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

    def next(self) -> list[int]:
        if self._plan is None:
            self._plan = self.epoch_plan(self.epoch)
        if self.position >= len(self._plan):
            self.epoch, self.position = self.epoch + 1, 0
            self._plan = self.epoch_plan(self.epoch)
        batch = self._plan[self.position]
        self.position += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position, self._plan = int(state["epoch"]), int(state["position"]), None
