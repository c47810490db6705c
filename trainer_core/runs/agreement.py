"""The processes of one run (torchrun: on one machine or several, each machine with its own run file) must train one
thing: the gradients they sum mean something only when every process computes them for the same LoRA, settings and
data. What they compare, before any step:

1. `check_same_settings`, right after they join (before a model file is read): every setting of their run files,
   apart from where each machine's files are (PER_MACHINE: model files, tokenizer, dataset, cache and output
   folders, the LoRA file to continue) and how its GPUs hold the model (blocks_to_swap, gradient_checkpointing,
   compile_float8, caching_batch_size: the same values either way, within rounding), and the command line's --steps.
2. `check_same_start`, once the run is open: the step, the base model, the LoRA weights and the data as cached (what
   a dataset folder holds on each machine: every sample's cache keys, which hash its image, caption, mask and the
   model files that encoded them, with its bucket, weight and regularisation mark; the repeats; the validation
   images).

A difference stops every process with one message naming what differs, the machines and both values. (Before,
only the step, the base model and the LoRA weights were compared: node groups whose run files asked for other
learning rates trained a mix of both that neither file described.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
from typing import Any

import torch

from ..core.errors import UserInputError
from ..training.distributed import Replicas
from .run_file import KEYS, RunFile

# Settings each machine may set its own way: where its files are (a path key), and how its GPUs hold the model and
# encode the cache (every entry is encoded alone, data/cache.py: the batch size changes no entry).
PER_MACHINE = {(k.table, k.name) for k in KEYS if k.path} | {
    ("train", "blocks_to_swap"), ("train", "gradient_checkpointing"), ("train", "compile_float8"),
    ("cache", "caching_batch_size")}
# At most this many differences are listed in one message.
LISTED = 5


def run_settings(run: RunFile, steps: int | None = None) -> dict[str, Any]:
    """'[table] key' -> value of every setting of `run` that all processes must share (all but PER_MACHINE), and the
    command line's --steps (`steps`) when given."""
    configs = {type(obj): obj for obj in (run.load, run.cache, run.lora, run.optimizer, run.train, run.headless,
                                          run.steps_cfg, run.preview, run.save)}
    settings: dict[str, Any] = {}
    for key in KEYS:
        if (key.table, key.name) in PER_MACHINE:
            continue
        if key.table == "dataset":
            for n, dataset in enumerate(run.datasets, 1):
                settings[f"[[dataset]] {n} {key.name}"] = getattr(dataset, key.field)
        elif key.table == "edit":
            edit = run.edit
            settings[f"[edit] {key.name}"] = None if edit is None else (
                edit.variant if key.name == "variant" else getattr(edit.data, key.field))
        else:
            settings[f"[{key.table}] {key.name}"] = getattr(configs[key.cls], key.field)
    settings["number of [[dataset]] tables"] = len(run.datasets)
    if steps is not None:
        settings["--steps"] = steps
    return settings


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a process runs, for a message: its machine (torchrun's node index), host, rank and run file."""

    node: int
    host: str
    rank: int
    where: str

    def __str__(self) -> str:
        return f"machine {self.node} (process {self.rank} on {self.host}, {self.where})"


def check_same_settings(run: RunFile, replicas: Replicas, steps: int | None = None) -> None:
    """Every process's run settings equal process 0's, or every process stops naming the differences."""
    if replicas.size == 1:
        return
    place = Place(replicas.node, socket.gethostname(), replicas.rank, run.where)
    # As JSON and back: plain values compare alike on every machine (a tuple and a list, say) and travel small
    gathered = replicas.gather((place, json.dumps(run_settings(run, steps), default=str)))
    reports = [(p, json.loads(s)) for p, s in gathered]
    differences = setting_differences(reports)
    if differences:
        raise UserInputError(
            f"the run settings of this run's {replicas.size} processes disagree, so they would train a mix that no run "
            f"file describes: {'; '.join(differences)}. Every machine's run file must hold the same settings, apart "
            "from where its files are (model files, tokenizer, dataset and cache folders, output folder, "
            "continue_from_lora) and how its GPUs hold the model (blocks_to_swap, gradient_checkpointing, "
            "compile_float8, caching_batch_size): make them equal (the same --steps too) and start every machine "
            "again. Nothing was trained.")


def setting_differences(reports: list[tuple[Place, dict[str, Any]]]) -> list[str]:
    """'<setting> is A on <process 0's place> and B on <its place>' for each setting a process holds otherwise than
    process 0 (at most LISTED, the rest counted)."""
    (first, reference), found = reports[0], []
    for place, settings in reports[1:]:
        for name in [*reference, *(k for k in settings if k not in reference)]:
            if reference.get(name) != settings.get(name):
                found.append(f"{name} is {_shown(reference.get(name))} on {first} and {_shown(settings.get(name))} "
                             f"on {place}")
    return found[:LISTED] + ([f"and {len(found) - LISTED} more"] if len(found) > LISTED else [])


def _shown(value: Any) -> str:
    return "not set" if value is None else json.dumps(value)


# -- the start ----------------------------------------------------------------------------------------------------

def sample_digest(sample) -> str:
    """What a cached sample trains with, as 16 hex digits: its cache keys (image, caption, conditions, mask, class
    caption, each keyed by content and by the model files that encoded it), bucket, loss weight and mark."""
    parts = (sample.latent_key, sample.text_key, sample.empty_text_key, list(sample.condition_keys), sample.mask_key,
             sample.preservation_text_key, list(sample.bucket), sample.loss_weight, sample.regularization)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def start_report(trainer) -> dict[str, Any]:
    """What every process must start from: step, base model, LoRA weights (a checksum), the cached data."""
    with torch.no_grad():
        weights = sum(float(p.detach().double().sum()) + float(p.detach().double().abs().sum())
                      for p in trainer.built.params)
    dataset = trainer.dataset
    return {"step": trainer.step, "base": f"{trainer.components.name} ({trainer.built.base_fingerprint[:12]})",
            "lora": weights, "samples": [sample_digest(s) for s in dataset.samples],
            "paths": [s.image_path for s in dataset.samples], "repeats": dataset.repeats,
            "validation": [sample_digest(s) for s in dataset.validation]}


def start_differences(reports: list[tuple[Place, dict[str, Any]]]) -> list[str]:
    """What a process starts from otherwise than process 0, each naming both places and values."""
    (first, ref), found = reports[0], []
    for place, report in reports[1:]:
        on = f"on {first} and on {place}"
        if report["step"] != ref["step"]:
            found.append(f"the step: {ref['step']} and {report['step']} {on} (each must read the checkpoints process 0 "
                         "writes: one output folder all machines see)")
        if report["base"] != ref["base"]:
            found.append(f"the base model: {ref['base']} and {report['base']} {on} (load the same model files)")
        elif report["lora"] != ref["lora"]:
            found.append(f"the LoRA weights {on} (the same checkpoint or continue_from_lora file)")
        if len(report["samples"]) != len(ref["samples"]):
            found.append(f"the number of training images: {len(ref['samples'])} and {len(report['samples'])} {on}")
        elif report["samples"] != ref["samples"]:
            n = next(i for i, (a, b) in enumerate(zip(ref["samples"], report["samples"])) if a != b)
            found.append(f"training image {n + 1}: {ref['paths'][n]} and {report['paths'][n]} {on} differ in content "
                         "(the image, its caption, mask or weight, or the text encoder or VAE file that cached it)")
        if report["repeats"] != ref["repeats"] or report["validation"] != ref["validation"]:
            found.append(f"the repeats or validation images {on}")
    return found


def check_same_start(trainer, replicas: Replicas, where: str) -> None:
    """Every process starts from process 0's step, base model, LoRA and cached data, or every process stops."""
    if replicas.size == 1:
        return
    place = Place(replicas.node, socket.gethostname(), replicas.rank, where)
    differences = start_differences(replicas.gather((place, start_report(trainer))))
    if differences:
        raise UserInputError(
            f"the {replicas.size} processes of this run start from different states: {'; '.join(differences)}. Their "
            "sum would mean nothing, so none trains: make each machine's files and folders hold the same, and start "
            "every machine again.")
