"""Several datasets in one run (run files' [[dataset]] tables): their samples in one list, each labelled with
its dataset, and the repeats per sample.

How they mix: the data order (order.py) visits every sample `repeats` times per epoch, whatever its dataset, so
a dataset's share of the steps is its images x repeats over all images x repeats; a regularisation set is no
exception (OneTrainer's concepts work the same way; raise or lower its repeats to see it more or less often).
A dataset's loss_weight then scales its images' losses (training/weighting.py).

The canvas mixes with the Dataset Mix node (`DatasetMix`: its parts as the Cache node's one DATASET input); a run
file with its [[dataset]] tables (runs/headless.py). Both cache what `combined` gives, so one set of folders and
settings caches and trains the same either way.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from ..core.errors import UserInputError
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


@dataclasses.dataclass(frozen=True)
class DatasetMix:
    """Several datasets as one (the Dataset Mix node's output): `parts` in order, a mix among them flattened."""

    parts: tuple[Dataset, ...]

    def summary(self) -> str:
        lines = [f"{len(self.parts)} datasets, {sum(len(d.samples) for d in self.parts)} images in all:"]
        for label, d in zip(distinct_labels(list(self.parts)), self.parts):
            notes = [*(["regularisation"] if d.config.is_regularization else []),
                     *([f"loss weight {d.config.loss_weight:g}"] if d.config.loss_weight != 1.0 else [])]
            lines.append(f"- {label}" + (f" ({', '.join(notes)})" if notes else "") + f": {d.summary()}")
        return "\n".join(lines)


def mix(datasets: list) -> DatasetMix:
    """The datasets (each a Dataset or a DatasetMix) as one DatasetMix."""
    parts = tuple(p for d in datasets for p in parts_of(d))
    if len(parts) < 2:
        raise UserInputError("a dataset mix needs at least two datasets: wire two or more Dataset nodes into it.")
    return DatasetMix(parts)


def parts_of(dataset) -> list[Dataset]:
    """A DatasetMix's datasets, or [a dataset]."""
    return list(dataset.parts) if isinstance(dataset, DatasetMix) else [dataset]


def cache_inputs(dataset) -> tuple[list[Sample], list[Sample], int | tuple[int, ...]]:
    """(training samples, validation samples, repeats) the Cache node caches of a Dataset or a DatasetMix. One
    dataset's samples are taken as they are (its repeats one number); a mix's are `combined`'s."""
    if isinstance(dataset, DatasetMix):
        return combined(list(dataset.parts))
    return list(dataset.samples), list(dataset.validation), dataset.config.repeats


def data_settings(family, dataset) -> Any:
    """The model family's data settings (`ModelFamily.data_settings`) of a Dataset or a DatasetMix. One cache
    build takes one set (Edit: one control_resolution for all controls), so a mix's parts must agree."""
    parts = parts_of(dataset)
    for d in parts:  # a part the family cannot train on is named as such, not as a settings mismatch
        family.check_samples(list(d.samples))
    settings = [family.data_settings(d) for d in parts]
    differ = [label for label, s in zip(distinct_labels(parts), settings) if s != settings[0]]
    if differ:
        raise UserInputError(
            f"the mixed datasets {distinct_labels(parts)[0]} and {differ[0]} have different {family.name} data "
            f"settings ({settings[0]} and {settings[distinct_labels(parts).index(differ[0])]}): one cache takes one, so "
            "set them alike on their Dataset nodes.")
    return settings[0]
