"""Training state: what a checkpoint holds, writing it, and continuing from it bit-exactly.

A checkpoint (checkpoint.py: the folder format, atomic writes, picking the newest usable one) holds the
adapter's weights, the optimizer's state, the step, the run's micro-batch counter (which fixes the data order
and every random draw: randomness.py), the loss and validation histories and the settings, and the EMA of the weights when it is on (ema.py; a
checkpoint without one still loads). Nothing else is needed to continue: the generator states of format 1 are gone with counter-based randomness.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..core.config import LoraConfig, OptimizerConfig, TrainConfig, field_default, to_dict
from ..core.errors import RunFolderLost, TrainingStopped, UserInputError
from ..core.files import write_error
from ..core.finite import all_finite, nonfinite_names
from . import checkpoint as ckpt
from .data_record import data_changed_note
from .distributed import world_size_note
from .ema import resume_note
from .optim import changed_settings, fixed_for_the_run, load_state
from .setup import Built, Decided

# LoRA settings a checkpoint must agree on to be continued (anything else may change between runs).
MUST_MATCH_LORA = ("rank", "alpha", "targets", "dtype", "adapter", "lokr_factor", "lokr_decompose_both")


@dataclass
class Progress:
    """How far a run is: what a checkpoint holds beside the weights, the optimizer's state and the settings, and
    what `resume` puts back. The recipe advances it after every optimizer step."""

    step: int = 0  # optimizer steps finished
    micro_batches: int = 0  # micro-batches drawn, over all processes: the data order's and randomness' counter
    loss_history: list[tuple[int, float]] = field(default_factory=list)  # (step, loss)
    # (step, {dataset label: its samples' mean loss}) when the report lists datasets (weighting.py)
    dataset_loss_history: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    validation_history: list[tuple[int, float]] = field(default_factory=list)  # (step, validation loss)
    # (step, moved from the untrained preview, moved from the previous one): live.PreviewMovement, None where unknown
    preview_history: list[tuple[int, float | None, float | None]] = field(default_factory=list)


def training_state(progress: Progress, built: Built, decided: Decided, optimizer: OptimizerConfig,
                   train: TrainConfig, base_model: str, num_samples: int, processes: int, data: dict | None = None
                   ) -> tuple[dict[str, torch.Tensor], dict]:
    """Everything needed to continue bit-exactly: (tensors, JSON-able metadata). `data`: the record of the data it
    trains on (data_record.py), which a resume compares with the data then."""
    # The training weights (for schedule-free AdamW its y; with its z they give the averaged x a LoRA file holds).
    tensors = {f"lora.{n}": p.detach() for n, p in zip(built.param_names, built.params)}
    optim_tensors, optim_rest = ckpt.flatten_state(built.optimizer.state_dict())
    tensors.update(optim_tensors)
    meta = {
        "step": progress.step,
        "micro_batches": progress.micro_batches,
        "loss_history": progress.loss_history,
        "dataset_loss_history": progress.dataset_loss_history,
        "validation_history": progress.validation_history,
        "preview_history": progress.preview_history,
        "optimizer_state": optim_rest,
        # The settings the run trained with: the adapter's as decided, and the swap count it streamed (as checkpoints
        # wrote them before 'auto' was a value of its own).
        "lora": to_dict(decided.lora), "optimizer": to_dict(optimizer),
        "train": {**to_dict(train), "blocks_to_swap": decided.swap.blocks_to_swap},
        "base_model": base_model, "base_fingerprint": built.base_fingerprint,
        "param_names": list(built.param_names),
        "num_samples": num_samples,
        "processes": processes,
    }
    if data is not None:
        meta["data"] = data
    if built.ema is not None:
        ema_tensors, meta["ema"] = built.ema.state(list(built.param_names))
        tensors.update(ema_tensors)
    return tensors, meta


def save_checkpoint(run_dir: Path, lock, writes: bool, step: int, tensors: dict[str, torch.Tensor],
                    meta: dict) -> Path | None:
    """Write the checkpoint of `step` (`training_state`) into `run_dir` while `lock` (None: none) is still this
    trainer's; only where the process `writes` (process 0: the state is the same on every process). The folder
    written, or None."""
    if lock is not None and not lock.still_held() and not lock.reacquire():
        raise RunFolderLost(
            f"the lock of run folder {run_dir} was removed or replaced and another trainer holds it now: the "
            f"checkpoint of step {step} was not written, so two trainers never mix their files. The trainer "
            "still holds its steps in memory: save the LoRA now; releasing the run drops the steps since its last "
            "checkpoint."
        )
    if not all_finite(tensors.values()):
        bad = nonfinite_names(tensors)
        raise TrainingStopped(
            f"the checkpoint of step {step} was not written: {len(bad)} of its tensors hold NaN or inf "
            f"values (first: {bad[:2]}). The newest checkpoint in {ckpt.checkpoints_dir(run_dir)} is "
            "unchanged.")
    if not writes:
        return None
    try:
        return ckpt.save_checkpoint(run_dir, step, tensors, meta)
    except OSError as e:
        raise write_error(e, f"checkpoint of step {step}", ckpt.checkpoints_dir(run_dir),
                          f"The trainer still holds step {step} in memory.") from None


def resume(run_dir: Path, notes: list[str], built: Built, decided: Decided, optimizer: OptimizerConfig,
           train: TrainConfig, base_model: str, processes: int, data: dict | None = None
           ) -> tuple[Progress, Path] | None:
    """Load the newest usable checkpoint in `run_dir` (complete, finite values) into `built`'s weights, optimizer
    and EMA; its progress and folder, or None when there is none. A sentence per checkpoint passed over (and per
    setting that changed since, and one when the data now, `data`'s record, differs from the checkpoint's) goes to
    `notes`."""
    loaded = ckpt.load_latest(run_dir, notes=notes)
    if loaded is None:
        return None
    tensors, meta, folder = loaded
    check_compatible(meta, folder, decided.lora, optimizer, built, base_model, train.run_name)
    note = world_size_note(meta, processes, train.grad_accum_steps)
    if note is not None:
        notes.append(note)
    with torch.no_grad():
        for name, p in zip(built.param_names, built.params):
            p.copy_(tensors[f"lora.{name}"])
    # The saved state and running values, the current settings (optim.RUNNING_GROUP_VALUES), the saved dtypes
    load_state(built.optimizer, ckpt.unflatten_state(tensors, meta["optimizer_state"]), optimizer.optimizer)
    changed = changed_settings(meta["optimizer"], optimizer)
    if changed:
        notes.append(f"the optimizer settings changed since the checkpoint of step {meta['step']}: {', '.join(changed)}; "
                     f"they apply from step {meta['step'] + 1} on.")
    data_note = data_changed_note(meta.get("data"), data, meta["step"]) if data is not None else None
    if data_note is not None:
        notes.append(data_note)
    if built.ema is not None and meta.get("ema"):
        built.ema.load(list(built.param_names), tensors, meta["ema"])
    elif built.ema is not None:  # written with ema off: the average starts here
        built.ema.restart()
        notes.append(resume_note(meta["step"]))
    progress = Progress(
        step=meta["step"], micro_batches=meta["micro_batches"],
        loss_history=[tuple(x) for x in meta["loss_history"]],
        dataset_loss_history=[tuple(x) for x in meta.get("dataset_loss_history", [])],  # (older: none)
        validation_history=[tuple(x) for x in meta.get("validation_history", [])],
        preview_history=[tuple(x) for x in meta.get("preview_history", [])])  # (older: none)
    return progress, folder


def check_compatible(meta: dict, folder: Path, lora: LoraConfig, optimizer: OptimizerConfig, built: Built,
                     base_model: str, run_name: str) -> None:
    # A checkpoint written before a LoRA setting existed trained with its default.
    saved_lora = {key: meta["lora"].get(key, field_default(LoraConfig, key)) for key in MUST_MATCH_LORA}
    differences = [
        f"{key}: checkpoint {saved_lora[key]!r}, now {getattr(lora, key)!r}"
        for key in MUST_MATCH_LORA if saved_lora[key] != getattr(lora, key)
    ]
    differences += fixed_for_the_run(meta["optimizer"], optimizer)  # the optimizer kind, ...
    if meta["base_fingerprint"] not in built.accepted_base_fingerprints:
        differences.append(f"base model: checkpoint {meta['base_model']!r}, now {base_model!r} "
                           "(different weights)")
    elif meta["param_names"] != list(built.param_names):
        differences.append("LoRA layers differ (another model size or target set)")
    if differences:
        raise UserInputError(
            f"run '{run_name}' has a checkpoint at step {meta['step']} ({folder}) that does not "
            f"match these settings: {'; '.join(differences)}. Change them back to continue that run, or use a "
            "new run_name to start another."
        )
