"""A trainer's life: it claims its model set and run folder, and gives both back (`close`) or retires.

A trainer owns its adapter, and a model set carries one adapter: a second live trainer on one model set is
refused (`runs.open_run` retires the previous one first) rather than train each other's weights. One
trainer per run folder, in this process or any other (run_lock.RunLock). `close` gives the transformer back
as it was (no adapter, blocks' own forwards); the Trainer's `retire` (recipe.py) checkpoints, closes and refuses
any further use. (runs/registry.py keeps the live trainers by run name; this module is one trainer's side of it.)
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import torch

from ..adapters.lora import remove_lora
from ..core.errors import UserInputError
from ..core.files import write_error
from ..core.host_memory import give_back_freed_memory
from ..core.run_lock import RunLock
from ..streaming.runner import uninstall_leftover_runner
from . import checkpoint as ckpt

# A trainer claims a model set as itself (`owner`, held weakly): the model set's one adapter is that trainer's.


def claim_model_set(components, owner) -> None:
    """`owner` (a Trainer) becomes the one trainer of `components`, or a UserInputError names the run training it."""
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
    components.trainer_ref = weakref.ref(owner)


def _live_holder(components) -> "Trainer | None":
    holder = components.trainer_ref() if components.trainer_ref is not None else None
    return holder if holder is not None and holder.live else None


def lock_run_folder(run_dir: Path | None, writes: bool, run_name: str) -> RunLock | None:
    """Process 0 (`writes`) of a run with a folder holds its lock, then tidies what killed writes left there (ours
    now). The lock held, or None."""
    if run_dir is None or not writes:
        return None
    lock = RunLock(run_dir)
    try:
        lock.acquire(owner=f"run '{run_name}'")
    except OSError as e:
        raise write_error(e, f"lock file of run '{run_name}'", run_dir,
                          "Nothing was trained or changed.") from None
    ckpt.remove_leftovers(run_dir)
    return lock


def close(components, owner, built, lock: RunLock | None, device: torch.device, unpin: bool = False) -> None:
    """Give the transformer back as it was, drop every tensor `built` holds (adapter, gradients, optimizer
    state, swap slots; None: nothing was built) and unlock the run folder. The model set can then be trained by a
    new Trainer. `owner`: the trainer closing, which takes the adapter out only where it claimed the model set.
    `unpin`: also move the swapped blocks' master weights out of pinned memory (when the model set is released
    rather than handed on)."""
    if built is not None:
        built.runner.uninstall(unpin=unpin)
    holder = components.trainer_ref() if components.trainer_ref is not None else None
    if holder is owner:  # never take out an adapter that another trainer owns
        if built is not None:
            remove_lora(built.transformer)
        components.trainer_ref = None
    if built is not None:
        built.optimizer.state.clear()
        built.optimizer.param_groups.clear()
    if lock is not None:
        lock.release()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    # the closed run's host copies (checkpoint staging, unpinned arena chunks) back to the system
    give_back_freed_memory(pinned=True)
