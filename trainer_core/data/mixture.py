"""Several datasets in one run (run files' [[dataset]] tables): their samples in one list, each labelled with
its dataset, and the repeats per sample.

How they mix: the data order (order.py) visits every sample `repeats` times per epoch, whatever its dataset, so
a dataset's share of the steps is its images x repeats over all images x repeats; a regularisation set is no
exception (OneTrainer's concepts work the same way; raise or lower its repeats to see it more or less often).
A dataset's loss_weight then scales its images' losses (training/weighting.py).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from .images import Dataset, Sample


def combined(datasets: list[Dataset]) -> tuple[list[Sample], list[Sample], int | tuple[int, ...]]:
    """(training samples, validation samples, repeats: one number, or one per training sample) of the datasets
    in order. Labels are made distinct: the same folder twice (two resolutions) becomes 'name@512', 'name@1024',
    two folders of one name 'name', 'name (2)'."""
    labels = distinct_labels(datasets)
    samples, validation, repeats = [], [], []
    for dataset, label in zip(datasets, labels):
        samples += [dataclasses.replace(s, dataset=label) for s in dataset.samples]
        validation += [dataclasses.replace(s, dataset=label) for s in dataset.validation]
        repeats += [dataset.config.repeats] * len(dataset.samples)
    return samples, validation, (repeats[0] if len(set(repeats)) == 1 else tuple(repeats))


def distinct_labels(datasets: list[Dataset]) -> list[str]:
    base = [d.samples[0].dataset if d.samples else "dataset" for d in datasets]
    counts = Counter(base)
    labels = [f"{b}@{d.config.resolution}" if counts[b] > 1 else b for b, d in zip(base, datasets)]
    seen: Counter = Counter()
    out = []
    for label in labels:
        seen[label] += 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out
