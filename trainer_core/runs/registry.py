"""The run recipe: the one path from settings to a live trainer, for the nodes, the demo and the CLI.

    run = open_run(components, dataset, lora, optimizer, train, run_dir="out/run")
    run.trainer.train(100)
    release(run.trainer.train_cfg.run_name)      # checkpoint, free GPU memory and pinned RAM

`open_run` gets or creates the run of `train.run_name`:
- the live trainer of that name, built from the same inputs: continue it (nothing is rebuilt);
- the live trainer of that name with other settings: if they may change between runs (learning rate,
  schedule, swap count, ...), checkpoint and retire it, then build a new trainer that resumes from that
  checkpoint bit-exactly; if not (rank, alpha, targets, LoRA dtype, optimizer kind, base weights), an error
  that names each difference, and the live trainer goes on untouched;
- no live trainer: build one and resume from the run folder's newest checkpoint, if any.

Ownership: a trainer owns its adapter and a model set carries one adapter, so at most one live trainer
per model set. Opening a run on a model set that another run trains checkpoints and retires that run;
its trainer then refuses every use with an error naming both runs (never a silent mix of adapters).
The Trainer checks the settings against the model and decides what they leave open once, when it is built
(training/setup.py): `blocks_to_swap='auto'` becomes a count from the memory plan (`planner.for_run.plan_run`),
after `before_build` ran (a host frees its own models there).

Live trainers are kept here by run name, because a host may drop the object that holds one (ComfyUI
evicts cached node outputs under memory pressure): the next `open_run` of that name finds it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core.config import LoraConfig, OptimizerConfig, TrainConfig, check_run_name, to_dict
from ..core.errors import UserInputError
from ..core.files import inside
from ..data.cache import CachedDataset
from ..models.components import QwenImageComponents
from ..training import MUST_MATCH_LORA, Trainer
from ..training.distributed import ONE_PROCESS, Replicas
from ..training.idle_settings import idle_settings
from ..training.optim import fixed_for_the_run


@dataclass
class OpenedRun:
    trainer: Trainer
    action: str  # "continued" (the live trainer), "resumed" (from a checkpoint) or "started" (at step 0)
    status: str  # one paragraph for a person: what happened, the swap count, the memory plan


@dataclass
class _Live:
    trainer: Trainer
    signature: str
    opened: str = ""  # the status it was started or resumed with: a continued run's status repeats its plan


_lock = threading.RLock()
_live: dict[str, _Live] = {}  # run name -> its live trainer
_changes: dict[str, int] = {}  # run name -> how often its live trainer was retired or released


def open_run(
    components: QwenImageComponents,
    dataset: CachedDataset,
    lora: LoraConfig,
    optimizer: OptimizerConfig,
    train: TrainConfig,
    run_dir: str | Path | None,
    init_lora: str | Path | None = None,
    before_build: Callable[[], None] | None = None,
    exclusive: bool = False,
    replicas: Replicas = ONE_PROCESS,
    preview_size: tuple[int, int] | None = None,
) -> OpenedRun:
    """Get or create the run of `train.run_name` (see module docstring). `run_dir`: its checkpoints (None:
    none, and nothing to resume). `before_build` runs only when a trainer is about to be built.
    `exclusive`: release every other live run, on other model sets too (one GPU, one training: a host
    that replaced its model set must not keep the old one's trainer and memory alive). `replicas`: this
    process's place among the processes of a data-parallel run (distributed.py). `preview_size`: (width,
    height) of the previews the caller will sample, for the memory plan (None: the Preview node's default)."""
    name = check_run_name(train.run_name)
    run_dir = Path(run_dir) if run_dir is not None else None
    signature = run_signature(components, dataset, lora, optimizer, train, run_dir, init_lora) + f"/{replicas.size}"
    with _lock:
        live = _live.get(name)
        if live is not None and live.trainer.live and live.signature == signature:
            first, _, rest = live.opened.partition("\n")
            return OpenedRun(live.trainer, "continued",
                             f"continuing run '{name}' at step {live.trainer.step} (still in memory; {first})"
                             + (f"\n{rest}" if rest else ""))
        if live is not None and live.trainer.live:
            conflicts = setting_conflicts(live.trainer, lora, optimizer, components)
            if conflicts:
                raise UserInputError(
                    f"run '{name}' is training (step {live.trainer.step}) with other settings: {'; '.join(conflicts)}. "
                    "Change them back to continue that run, or use a new run_name to start another."
                )
            _retire(name, f"run '{name}' was rebuilt with new settings at step {live.trainer.step}: use the trainer "
                          "that its Init Trainer gives now.")
        previous = components.trainer_ref() if components.trainer_ref is not None else None
        if previous is not None and previous.live:
            other = previous.train_cfg.run_name
            kept = (f"Its training is kept in its checkpoint ({previous.run_dir})" if previous.run_dir is not None
                    else "It had no run folder, so its training is gone")
            _retire(other, f"run '{other}' was retired at step {previous.step}: run '{name}' started training the "
                           f"same loaded model, and one loaded model trains one LoRA at a time. {kept}. To go on "
                           f"with '{other}', run its Init Trainer again (and bypass or remove the other run's Init "
                           "Trainer), or give both the same run_name.")
        if exclusive:
            # (A run on this same model set is retired below without moving the model off the GPU.)
            for other in [n for n in live_runs() if n != name and _live[n].trainer.components is not components]:
                _release(other, f"run '{other}' was released at step {_live[other].trainer.step}: run '{name}' "
                                "started, and one run trains at a time here. Run its Init Trainer again to resume it "
                                "from its checkpoint.")
        if before_build is not None:
            before_build()
        trainer = Trainer(components, dataset, lora, optimizer, train, run_dir=run_dir, init_lora=init_lora,
                          replicas=replicas, preview_size=preview_size)
        try:
            resumed = trainer.resume()
        except BaseException:
            trainer.close()
            raise
        _live[name] = _Live(trainer, signature)
    if resumed:
        head = f"resumed run '{name}' from its checkpoint at step {trainer.step}{_where(run_dir)}"
    else:
        head = f"started run '{name}' at step 0" + (f"; checkpoints go to {run_dir}" if run_dir else "")
    if trainer.resume_notes:  # checkpoints passed over (unreadable, incomplete, NaN/inf): say which and why
        head += "\n" + "\n".join(trainer.resume_notes)
    for note in idle_settings(dataset, lora, optimizer, train):  # settings that change nothing here, said
        head += f"\nwarning: {note}"
    family = components.family
    head += (f"\nmodel: {family.describe(components)}; its weights' licence: {family.weights_licence} (a LoRA trained "
             "on them derives from them)")
    swap = trainer.decided.swap
    status = f"{head}\nblocks_to_swap: {swap.label}" + (
        f"\n{swap.checkpointing_note}" if swap.checkpointing_note else "") + f"\n\n{trainer.memory_plan}"
    with _lock:
        if _live.get(name) is not None and _live[name].trainer is trainer:
            _live[name].opened = status
    return OpenedRun(trainer, "resumed" if resumed else "started", status)


RUNS_FOLDER = "qwen_lora_training/runs"  # inside the host's output folder


def run_folder(output_root: str | Path, run_name: str) -> Path:
    """The real path of run `run_name`'s folder inside `output_root`. Refused: a name that differs only by
    case from an existing run folder (one folder on Windows and macOS disks, two on Linux: a workflow would
    change meaning when moved), and a run folder, or its checkpoints folder, that is a link leading outside
    `output_root` (no write follows a link out of the output folder)."""
    name = check_run_name(run_name)
    root = Path(output_root).resolve()
    runs_dir = inside(root, RUNS_FOLDER, "the runs folder", RUNS_FOLDER)
    if runs_dir.is_dir():
        for entry in runs_dir.iterdir():
            if entry.name != name and entry.name.casefold() == name.casefold():
                raise UserInputError(
                    f"run_name={name!r} differs only by case from the run folder {entry}: on Windows and macOS "
                    f"disks they are one folder. Use run_name={entry.name!r} to continue that run, or a name "
                    "that differs by more than case."
                )
    folder = runs_dir / name
    for path in (folder, folder / "checkpoints"):
        real = path.resolve()
        if real != root and root not in real.parents:
            link = folder if folder.is_symlink() else path
            raise UserInputError(
                f"run_name {name!r} leads outside {root} through the link {link} -> {os.readlink(link)}. Nothing "
                "is written outside the output folder: remove the link, or use another run_name."
            )
    return folder


def release(run_name: str) -> str:
    """Checkpoint the live trainer of `run_name`, drop it (adapter, optimizer, swap slots, pinned masters)
    and free its model set (`_park`), so the GPU and host RAM go back to other work. The next `open_run`
    of that name resumes from the checkpoint. Returns what was done, for a person."""
    with _lock:
        live = _live.get(run_name)
        if live is None or not live.trainer.live:
            return f"run '{run_name}' holds no memory (nothing to release)"
        trainer = live.trainer
        where_model = _release(run_name, f"run '{run_name}' was released at step {trainer.step} (its memory was "
                                         "given back): queue again, and Init Trainer resumes it from its checkpoint.")
    return (f"released run '{run_name}' at step {trainer.step}: GPU memory and pinned RAM freed, {where_model}; "
            f"its checkpoint{_where(trainer.run_dir)} continues it")


def release_all() -> list[str]:
    """`release` every live run; their messages."""
    return [release(name) for name in live_runs()]


def live_runs() -> list[str]:
    with _lock:
        return [name for name, live in _live.items() if live.trainer.live]


def find(run_name: str) -> Trainer | None:
    """The live trainer of `run_name`, or None."""
    with _lock:
        live = _live.get(run_name)
        return live.trainer if live is not None and live.trainer.live else None


def changes(run_name: str) -> int:
    """How often the live trainer of `run_name` was retired or released: a host re-runs its Init Trainer
    when this changes (ComfyUI's IS_CHANGED), so a released run is rebuilt on the next queue."""
    with _lock:
        return _changes.get(run_name, 0)


def _retire(run_name: str, reason: str, unpin: bool = False) -> None:
    live = _live.get(run_name)
    if live is None:
        return
    live.trainer.retire(reason, unpin=unpin)  # raises (checkpoint not written) with the run still live
    del _live[run_name]
    _changes[run_name] = _changes.get(run_name, 0) + 1


def _release(run_name: str, reason: str) -> str:
    components = _live[run_name].trainer.components
    _retire(run_name, reason, unpin=True)
    return _park(components)


def _park(components: QwenImageComponents) -> str:
    """Free the model set's memory: drop the transformer when its file can stream it again (the next Init
    does), else move it to the CPU; drop or park the VAE; return the GPU's cached memory. Says which."""
    if components.unload_transformer():
        where = "the transformer dropped from memory (Init Trainer reads it from its file again)"
    else:
        components.transformer.to("cpu")
        where = "the model moved to the CPU"
    components.release_vae()
    components.give_memory_back()
    return where


def run_signature(components, dataset, lora, optimizer, train, run_dir, init_lora) -> str:
    """What a live trainer was built from; the same inputs continue it instead of rebuilding it."""
    parts = {
        "models": id(components),
        # An edited mask rebuilds too; so does a dataset's new loss weight, regularisation mark, label or class caption
        # (the loss reads them from the cached samples, which a continued trainer would keep).
        "samples": [(s.latent_key, s.text_key, s.mask_key, s.dataset, s.loss_weight, s.regularization,
                     s.preservation_text_key) for s in dataset.samples],
        "repeats": dataset.repeats,
        "lora": to_dict(lora), "optimizer": to_dict(optimizer), "train": to_dict(train),
        "run_dir": str(run_dir), "init_lora": str(init_lora),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def setting_conflicts(trainer: Trainer, lora: LoraConfig, optimizer: OptimizerConfig,
                      components: QwenImageComponents) -> list[str]:
    """Differences between a live trainer and new settings that a run cannot continue across (the same
    rule a checkpoint is held to: `Trainer.MUST_MATCH_LORA`, `optim.fixed_for_the_run`, the base weights)."""
    asked = trainer.lora_cfg
    conflicts = [f"{key}: running {getattr(asked, key)!r}, now {getattr(lora, key)!r}"
                 for key in MUST_MATCH_LORA if getattr(asked, key) != getattr(lora, key)]
    conflicts += fixed_for_the_run(to_dict(trainer.optim_cfg), optimizer, "running")  # the optimizer kind, ...
    if components is not trainer.components and components.fingerprint("transformer") != trainer.built.base_fingerprint:
        conflicts.append(f"base model: running {trainer.components.name!r}, now {components.name!r} (different weights)")
    return conflicts


def _where(run_dir: Path | None) -> str:
    return f" ({run_dir})" if run_dir is not None else ""
