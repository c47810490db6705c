"""A trainer's life: it claims its model set and run folder, and gives both back (`close`) or retires.

A trainer owns its adapter, and a model set carries one adapter: a second live trainer on one model set is
refused (`runs.open_run` retires the previous one first) rather than train each other's weights. One
trainer per run folder, in this process or any other (run_lock.RunLock). `close` gives the transformer back
as it was (no adapter, blocks' own forwards); `retire` checkpoints, closes and refuses any further use.
(runs.py keeps the live trainers by run name; this module is one trainer's side of it.)
"""

from __future__ import annotations

import gc
import weakref

import torch

from ..adapters.lora import remove_lora
from ..core.errors import RunFolderLost, UserInputError
from ..core.files import write_error
from ..core.run_lock import RunLock
from ..streaming.runner import uninstall_leftover_runner
from . import checkpoint as ckpt

# `trainer` below is the recipe's Trainer (recipe.py), which holds the state these functions work on; it is
# not imported here, so the recipe's components stay below the recipe.


def claim_model_set(trainer: "Trainer") -> None:
    components = trainer.components
    if _live_holder(components) is not None:
        # Before refusing: a trainer dropped without close() that something still reached through a reference cycle
        # (the Trainer makes none itself) lives until the cyclic garbage collector runs. Collect it now rather than
        # refuse on behalf of a trainer nobody can reach to release.
        gc.collect()
    holder = _live_holder(components)
    if holder is not None:
        raise UserInputError(
            f"this model set is being trained by run '{holder.train_cfg.run_name}'; one loaded model trains one "
            "LoRA at a time. Retire or release that run first (runs.open_run does so), or load the model again."
        )
    leftover = components.trainer_ref is not None and components.trainer_ref() is None  # dropped without close()
    if leftover and components.transformer is not None:
        uninstall_leftover_runner(components.transformer)
        remove_lora(components.transformer)
    components.trainer_ref = weakref.ref(trainer)


def _live_holder(components) -> "Trainer | None":
    holder = components.trainer_ref() if components.trainer_ref is not None else None
    return holder if holder is not None and holder.live else None


def lock_run_folder(trainer: "Trainer") -> None:
    """Process 0 of a run with a folder holds its lock, then tidies what killed writes left there (ours now)."""
    if trainer.run_dir is None or not trainer.replicas.writes:
        return
    run_name = trainer.train_cfg.run_name
    trainer.lock = RunLock(trainer.run_dir)
    try:
        trainer.lock.acquire(owner=f"run '{run_name}'")
    except OSError as e:
        raise write_error(e, f"lock file of run '{run_name}'", trainer.run_dir,
                          "Nothing was trained or changed.") from None
    ckpt.remove_leftovers(trainer.run_dir)


def retire(trainer: "Trainer", reason: str, unpin: bool = False) -> None:
    """Checkpoint, give the model back (`close`), let go of the model set and the dataset, and refuse any
    further use with `reason`. The loss history stays (a loss plot still works)."""
    if trainer.retired_reason is not None:
        return
    if trainer.params:
        try:
            trainer.checkpoint_if_behind()  # if this fails (a full disk) nothing is retired: no step is lost
        except RunFolderLost:
            pass  # another trainer owns the folder now: writing there would mix two runs' checkpoints
    trainer.retired_reason = reason
    close(trainer, unpin=unpin)
    trainer.components = trainer.transformer = trainer.dataset = trainer.flow = None


def close(trainer: "Trainer", unpin: bool = False) -> None:
    """Give the transformer back as it was, drop every tensor the trainer owns (adapter, gradients, optimizer
    state, swap slots) and unlock the run folder. The model set can then be trained by a new Trainer.
    `unpin`: also move the swapped blocks' master weights out of pinned memory (when the model set is
    released rather than handed on)."""
    components = trainer.components
    if components is None:  # retired: closed already
        return
    if trainer.runner is not None:
        trainer.runner.uninstall(unpin=unpin)
    owner = components.trainer_ref() if components.trainer_ref is not None else None
    if owner is trainer:  # never take out an adapter that another trainer owns
        if trainer.transformer is not None:
            remove_lora(trainer.transformer)
        components.trainer_ref = None
    if trainer.optimizer is not None:
        trainer.optimizer.state.clear()
        trainer.optimizer.param_groups.clear()
    trainer.params, trainer.runner, trainer.optimizer, trainer.ema = [], None, None, None
    if trainer.lock is not None:
        trainer.lock.release()
    if trainer.device.type == "cuda":
        torch.cuda.empty_cache()
