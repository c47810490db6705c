"""Periodic work: the one mechanism for what happens every N optimizer steps while training.

    trainer.train(100, work=[
        every(1, show_progress),                                   # a host's progress bar, Cancel checks
        *StepExtras(preview_every=25, preview=settings).work(),    # live previews and LoRA snapshots
    ])

The recipe runs, after each finished (not skipped) optimizer step, first the trainer's own work (the EMA of the
weights every step when it is on, validation every `validation_every` steps, a checkpoint every
`checkpoint_every`), then the caller's, in order. Steps are
counted from the run's first step, so "every 50" means steps 50, 100, ... also across chunks and resumes. Work
may raise (a host's Cancel) to stop at that step boundary: the recipe checkpoints and stays usable. Work whose
time is not training (previews, snapshots) is marked `extra`: its seconds are left out of seconds per step.

Periodic work leaves the training bit-identical: every training draw is a pure function of counters
(randomness.py), so sampling a preview in between changes nothing that training draws.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import saved_previews
from .live import PreviewSettings, StepPreview
from .reports import StepReport, TrainReport

# `trainer` below is the recipe's Trainer (recipe.py), which holds the state these functions work on; it is
# not imported here, so the recipe's components stay below the recipe.


@dataclass(frozen=True)
class Every:
    """`do(trainer, step_report, train_report)` after every `steps`-th optimizer step of the run (0: never)."""

    steps: int
    do: Callable[["Trainer", StepReport, TrainReport], None]
    name: str = ""
    extra: bool = False  # not training: its seconds are left out of seconds per step

    def due(self, step: int) -> bool:
        return self.steps > 0 and step % self.steps == 0


def every(steps: int, callback: Callable[[StepReport], None], name: str = "") -> Every:
    """Work that only needs the step's report (progress, logging, a stop check)."""
    return Every(steps, lambda trainer, step, report: callback(step), name or getattr(callback, "__name__", ""))


def run_due(work: Sequence[Every], trainer: "Trainer", step: StepReport, report: TrainReport) -> None:
    for item in work:
        if item.due(step.step):
            started = time.perf_counter()
            item.do(trainer, step, report)
            if item.extra:
                report.extra_seconds += time.perf_counter() - started


# -- the trainer's own periodic work ----------------------------------------------------------------------


def _update_ema(trainer: "Trainer", step: StepReport, report: TrainReport) -> None:
    trainer.built.ema.update()  # first: the checkpoints, previews and snapshots of this step see the updated average


def _validate(trainer: "Trainer", step: StepReport, report: TrainReport) -> None:
    trainer.progress.validation_history.append((trainer.step, trainer.validation_loss()))


def _checkpoint(trainer: "Trainer", step: StepReport, report: TrainReport) -> None:
    trainer.save_checkpoint()


def training_work(trainer: "Trainer") -> list[Every]:
    """The EMA, validation and checkpoints, from the trainer's settings (validation only with held-out images)."""
    cfg = trainer.train_cfg
    work = [Every(1, _update_ema, "ema")] if trainer.built.ema is not None else []
    if cfg.validation_every and trainer.dataset.validation:
        work.append(Every(cfg.validation_every, _validate, "validation"))
    if cfg.checkpoint_every:
        work.append(Every(cfg.checkpoint_every, _checkpoint, "checkpoint"))
    return work


# -- previews and LoRA snapshots (hosts choose them: Train Steps' widgets, a run file's [steps]) ---------------


@dataclass
class StepExtras:
    """`preview_every` / `snapshot_every`: every N steps (0 = off). `snapshot_path(step)` is where the
    LoRA snapshot of that step goes (the host decides the folder and name). The preview and the snapshot
    are handed to later work on the step's report (`StepReport.preview`, `.snapshot`).

    The one schedule of previews for every host (Train Steps, `train --config`): the untrained model's at step 0
    (`untrained_preview`), then every `preview_every` steps (`work`); `preview_due` says which steps. What a
    preview is stays the host's: `preview` (one prompt, sampled by the trainer and kept in `step_previews`), or
    `make_preview` (a run file's: every preview prompt into files)."""

    preview_every: int = 0
    preview: PreviewSettings | None = None
    snapshot_every: int = 0
    snapshot_path: Callable[[int], Path] | None = None
    # Called after each sampling step of a preview (step, of steps); may raise to stop (a host's Cancel).
    on_sampling_step: Callable[[int, int], None] | None = None
    # The host's own preview in place of sampling `preview`: returns what to hand on the step's report (None:
    # nothing sampled).
    make_preview: Callable[["Trainer"], StepPreview | None] | None = None

    @property
    def previews(self) -> bool:
        return bool(self.preview_every) and (self.preview is not None or self.make_preview is not None)

    def preview_due(self, step: int) -> bool:
        """Whether a run previews at `step` (of the run, from 0): the untrained model at 0 (`untrained_preview`),
        then where the preview's `Every` of `work` is due."""
        return self.previews and (step == 0 or Every(self.preview_every, self._preview).due(step))

    def work(self) -> list[Every]:
        work = []
        if self.previews:
            work.append(Every(self.preview_every, self._preview, "preview", extra=True))
        if self.snapshot_every and self.snapshot_path is not None:
            work.append(Every(self.snapshot_every, self._snapshot, "snapshot", extra=True))
        return work

    def untrained_preview(self, trainer: "Trainer") -> StepPreview | None:
        """At step 0, with previews on: the untrained model's preview (kept as step 0 in `step_previews`), so the
        previews that follow show what the LoRA changed against what the model drew without it (ai-toolkit also
        samples before its first step). Once: a step-0 preview already kept is not sampled again."""
        if not self.preview_due(0) or any(p.step == 0 for p in trainer.step_previews):
            return None
        if trainer.step == 0:
            return self._sample(trainer)
        self.restore_previews(trainer)
        return None

    def restore_previews(self, trainer: "Trainer") -> None:
        """A resumed trainer (built again from its checkpoint) takes the run's previews from its folder
        (saved_previews.py): Compare Steps shows step 0 again and the next preview is measured from the untrained
        one. Where they cannot come back, `trainer.preview_notes` says why (once)."""
        if trainer.run_dir is None or trainer.preview_notes:
            return
        restored = saved_previews.restore(trainer.run_dir, self.preview, trainer.step)
        if restored.note:
            trainer.preview_notes.append(restored.note)
        trainer.step_previews[:] = sorted({p.step: p for p in [*restored.kept, *trainer.step_previews]}.values(),
                                          key=lambda p: p.step)
        if trainer.preview_movement.untrained is None:
            trainer.preview_movement.untrained = restored.untrained
        if trainer.preview_movement.previous is None:
            trainer.preview_movement.previous = restored.previous

    def _sample(self, trainer: "Trainer") -> StepPreview | None:
        """This step's preview (the host's own, else `preview` sampled), measured against the untrained and the
        previous one (`Trainer.measure_preview`)."""
        if self.make_preview is not None:
            preview = self.make_preview(trainer)
        else:
            preview = trainer.preview_step(self.preview, progress=self.on_sampling_step)
        if preview is not None:
            trainer.measure_preview(preview)
            if trainer.run_dir is not None and trainer.replicas.writes:  # kept with the run for a resume
                small = next((p for p in trainer.step_previews if p.step == preview.step), None)
                saved_previews.save(trainer.run_dir, preview, small, self.preview)
        return preview

    def _preview(self, trainer: "Trainer", step: StepReport, report: TrainReport) -> None:
        step.preview = self._sample(trainer)
        if step.preview is not None:
            report.previews.append((trainer.step, step.preview.seconds))

    def _snapshot(self, trainer: "Trainer", step: StepReport, report: TrainReport) -> None:
        step.snapshot = trainer.save_lora(self.snapshot_path(trainer.step))
        report.snapshots.append(step.snapshot)
