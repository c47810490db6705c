"""Training state: what a checkpoint holds, writing it, and continuing from it bit-exactly.

A checkpoint (checkpoint.py: the folder format, atomic writes, picking the newest usable one) holds the
adapter's weights, the optimizer's state, the step, the run's micro-batch counter (which fixes the data order
and every random draw: randomness.py), the loss and validation histories and the settings, and the EMA of the weights when it is on (ema.py; a
checkpoint without one still loads). Nothing else is needed to continue: the generator states of format 1 are gone with counter-based randomness.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..core.config import LoraConfig, field_default, to_dict
from ..core.errors import RunFolderLost, TrainingStopped, UserInputError
from ..core.files import write_error
from ..core.finite import all_finite, nonfinite_names
from . import checkpoint as ckpt
from .distributed import world_size_note
from .ema import resume_note
from .optim import changed_settings, fixed_for_the_run, load_state

# `trainer` below is the recipe's Trainer (recipe.py), which holds the state these functions work on; it is
# not imported here, so the recipe's components stay below the recipe.

# LoRA settings a checkpoint must agree on to be continued (anything else may change between runs).
MUST_MATCH_LORA = ("rank", "alpha", "targets", "dtype", "adapter", "lokr_factor", "lokr_decompose_both")


def training_state(trainer: "Trainer") -> tuple[dict[str, torch.Tensor], dict]:
    """Everything needed to continue bit-exactly: (tensors, JSON-able metadata)."""
    # The training weights (for schedule-free AdamW its y; with its z they give the averaged x a LoRA file holds).
    tensors = {f"lora.{n}": p.detach() for n, p in zip(trainer.param_names, trainer.params)}
    optim_tensors, optim_rest = ckpt.flatten_state(trainer.optimizer.state_dict())
    tensors.update(optim_tensors)
    meta = {
        "step": trainer.step,
        "micro_batches": trainer.micro_batches,
        "loss_history": trainer.loss_history,
        "dataset_loss_history": trainer.dataset_loss_history,
        "validation_history": trainer.validation_history,
        "optimizer_state": optim_rest,
        "lora": to_dict(trainer.lora_cfg), "optimizer": to_dict(trainer.optim_cfg), "train": to_dict(trainer.train_cfg),
        "base_model": trainer.components.name, "base_fingerprint": trainer.base_fingerprint,
        "param_names": trainer.param_names,
        "num_samples": len(trainer.dataset.samples),
        "processes": trainer.replicas.size,
    }
    if trainer.ema is not None:
        ema_tensors, meta["ema"] = trainer.ema.state(trainer.param_names)
        tensors.update(ema_tensors)
    return tensors, meta


def save_checkpoint(trainer: "Trainer") -> Path | None:
    if trainer.run_dir is None:
        return None
    lock = trainer.lock
    if lock is not None and not lock.still_held() and not lock.reacquire():
        raise RunFolderLost(
            f"the lock of run folder {trainer.run_dir} was removed or replaced and another trainer holds it now: the "
            f"checkpoint of step {trainer.step} was not written, so two trainers never mix their files. The trainer "
            "still holds its steps in memory: save the LoRA now; releasing the run drops the steps since its last "
            "checkpoint."
        )
    tensors, meta = training_state(trainer)
    if not all_finite(tensors.values()):
        bad = nonfinite_names(tensors)
        raise TrainingStopped(
            f"the checkpoint of step {trainer.step} was not written: {len(bad)} of its tensors hold NaN or inf "
            f"values (first: {bad[:2]}). The newest checkpoint in {ckpt.checkpoints_dir(trainer.run_dir)} is "
            "unchanged.")
    if not trainer.replicas.writes:  # process 0 writes the state, which is the same on every process
        trainer.saved_step = trainer.step
        return None
    try:
        folder = ckpt.save_checkpoint(trainer.run_dir, trainer.step, tensors, meta)
    except OSError as e:
        raise write_error(e, f"checkpoint of step {trainer.step}", ckpt.checkpoints_dir(trainer.run_dir),
                          f"The trainer still holds step {trainer.step} in memory.") from None
    trainer.saved_step = trainer.step
    return folder


def checkpoint_if_behind(trainer: "Trainer") -> None:
    """A checkpoint of the current step unless the newest on disk is of it (or nothing finite is left to keep:
    then the last good checkpoint stays the newest)."""
    if trainer.broken_reason is None and trainer.run_dir is not None and trainer.saved_step != trainer.step:
        trainer.save_checkpoint()


def resume(trainer: "Trainer", notes: list[str]) -> bool:
    """Continue from the newest usable checkpoint in the run folder (complete, finite values); False when
    there is none. A sentence per checkpoint passed over goes to `notes`."""
    if trainer.run_dir is None:
        return False
    loaded = ckpt.load_latest(trainer.run_dir, notes=notes)
    if loaded is None:
        return False
    tensors, meta, folder = loaded
    check_compatible(trainer, meta, folder)
    note = world_size_note(meta, trainer.replicas.size, trainer.train_cfg.grad_accum_steps)
    if note is not None:
        notes.append(note)
    with torch.no_grad():
        for name, p in zip(trainer.param_names, trainer.params):
            p.copy_(tensors[f"lora.{name}"])
    # The saved state and running values, the current settings (optim.RUNNING_GROUP_VALUES), the saved dtypes
    load_state(trainer.optimizer, ckpt.unflatten_state(tensors, meta["optimizer_state"]), trainer.optim_cfg.optimizer)
    changed = changed_settings(meta["optimizer"], trainer.optim_cfg)
    if changed:
        notes.append(f"the optimizer settings changed since the checkpoint of step {meta['step']}: {', '.join(changed)}; "
                     f"they apply from step {meta['step'] + 1} on.")
    if trainer.ema is not None and meta.get("ema"):
        trainer.ema.load(trainer.param_names, tensors, meta["ema"])
    elif trainer.ema is not None:  # written with ema off: the average starts here
        trainer.ema.restart()
        notes.append(resume_note(meta["step"]))
    trainer.step = trainer.saved_step = meta["step"]
    trainer.micro_batches = meta["micro_batches"]
    trainer.restored_from = folder
    trainer.broken_reason = None
    trainer.loss_history = [tuple(x) for x in meta["loss_history"]]
    trainer.dataset_loss_history = [tuple(x) for x in meta.get("dataset_loss_history", [])]  # (older: none)
    trainer.validation_history = [tuple(x) for x in meta.get("validation_history", [])]
    trainer.step_previews = [p for p in trainer.step_previews if p.step <= trainer.step]  # none of undone steps
    return True


def check_compatible(trainer: "Trainer", meta: dict, folder: Path) -> None:
    # A checkpoint written before a LoRA setting existed trained with its default.
    saved_lora = {key: meta["lora"].get(key, field_default(LoraConfig, key)) for key in MUST_MATCH_LORA}
    differences = [
        f"{key}: checkpoint {saved_lora[key]!r}, now {getattr(trainer.lora_cfg, key)!r}"
        for key in MUST_MATCH_LORA if saved_lora[key] != getattr(trainer.lora_cfg, key)
    ]
    differences += fixed_for_the_run(meta["optimizer"], trainer.optim_cfg)  # the optimizer kind, ...
    if meta["base_fingerprint"] not in trainer.accepted_base_fingerprints:
        differences.append(f"base model: checkpoint {meta['base_model']!r}, now {trainer.components.name!r} "
                           "(different weights)")
    elif meta["param_names"] != trainer.param_names:
        differences.append("LoRA layers differ (another model size or target set)")
    if differences:
        raise UserInputError(
            f"run '{trainer.train_cfg.run_name}' has a checkpoint at step {meta['step']} ({folder}) that does not "
            f"match these settings: {'; '.join(differences)}. Change them back to continue that run, or use a "
            "new run_name to start another."
        )
