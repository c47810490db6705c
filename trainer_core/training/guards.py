"""Guards against non-finite values: nothing NaN/inf is kept or written.

- A step with a NaN/inf loss or gradient is skipped (no update); `max_nonfinite_steps` in a row stop training.
- A step whose update makes a LoRA value NaN/inf (one fused check after every optimizer step) is undone by
  restoring the newest checkpoint with finite values, and training stops saying so; with no such checkpoint
  the trainer refuses further use (`broken_reason`).
- A checkpoint with NaN/inf is never written (state.py), and resume passes over one (checkpoint.load_latest).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ..core.errors import TrainingStopped
from ..core.finite import nonfinite_names

ADVICE = "Lower the learning rate, keep max_grad_norm on, or train the LoRA in float32."


class SkippedSteps:
    """Counts skipped (non-finite) steps in a row within one `train` call; stops training at `limit` in a row.
    `continued_from`: the LoRA file the run continued, named in the message (None: a new LoRA)."""

    def __init__(self, limit: int, continued_from: Path | None):
        self.limit, self.continued_from = limit, continued_from
        self.in_a_row = 0

    def skipped(self, step: int) -> None:
        """A step was skipped; the LoRA is that of optimizer step `step`."""
        self.in_a_row += 1
        if self.in_a_row >= self.limit:
            # Every finished step left the LoRA finite (the recipe checks), and skipped steps change nothing.
            raise TrainingStopped(
                f"training stopped at step {step}: {self.in_a_row} steps in a row had a NaN/inf loss or "
                f"gradient, so they were skipped and the LoRA is unchanged since step {step}."
                f"{lora_file_note(self.continued_from)} Try a lower learning rate, keep max_grad_norm on, train the "
                "LoRA in float32, or check the dataset for broken images.")

    def finished(self) -> None:
        self.in_a_row = 0


def undo_nonfinite_step(failed: int, params: dict[str, torch.Tensor], continued_from: Path | None,
                        run_dir: Path | None, restore: Callable[[list[str]], tuple[int, Path] | None]) -> str:
    """Optimizer step `failed` just made LoRA values in `params` (name -> tensor) NaN/inf: put back the newest
    checkpoint with finite values (`restore(notes)`: LoRA, optimizer state, micro-batch counter; it returns that
    checkpoint's step and folder, or None) and stop, raising TrainingStopped. With none, return why the trainer
    must refuse further use from now on (the recipe keeps that reason and raises it)."""
    bad = nonfinite_names(params)
    what = (f"training stopped: optimizer step {failed} made {len(bad)} LoRA tensors NaN/inf (first: {bad[:2]})"
            f" although its loss and gradient were finite.{lora_file_note(continued_from)}")
    notes: list[str] = []
    error = ""
    try:
        restored = restore(notes)
    except Exception as e:  # noqa: BLE001 (the run folder changed under us: say so below)
        restored, error = None, f" (reading it failed: {e})"
    if restored is not None:
        step, folder = restored
        lost = f"; steps {step + 1} to {failed} are undone" if step + 1 < failed else f"; step {failed} is undone"
        raise TrainingStopped(
            f"{what} The LoRA and its optimizer state were restored from the checkpoint of step {step} "
            f"({folder}), the newest with finite values{lost}. {ADVICE}"
            + (f" ({' '.join(notes)})" if notes else ""))
    where = (f"its run folder {run_dir} holds no checkpoint with finite values{error}"
             if run_dir is not None else "this trainer has no run folder, so no checkpoint")
    return (f"{what} It could not be undone: {where}. The LoRA in memory is unusable; nothing was written from it "
            f"and this trainer refuses to train or save. Start the run again (queue again with a lower learning "
            f"rate, or use a new run_name). {ADVICE}")


def lora_file_note(continued_from: Path | None) -> str:
    if continued_from is None:
        return ""
    return f" This run continued from LoRA file {continued_from}."
