"""Guards against non-finite values: nothing NaN/inf is kept or written.

- A step with a NaN/inf loss or gradient is skipped (no update); `max_nonfinite_steps` in a row stop training.
- A step whose update makes a LoRA value NaN/inf (one fused check after every optimizer step) is undone by
  restoring the newest checkpoint with finite values, and training stops saying so; with no such checkpoint
  the trainer refuses further use (`broken_reason`).
- A checkpoint with NaN/inf is never written (state.py), and resume passes over one (checkpoint.load_latest).
"""

from __future__ import annotations

from ..errors import TrainingStopped
from ..finite import nonfinite_names

# `trainer` below is the recipe's Trainer (recipe.py), which holds the state these functions work on; it is
# not imported here, so the recipe's components stay below the recipe.

ADVICE = "Lower the learning rate, keep max_grad_norm on, or train the LoRA in float32."


class SkippedSteps:
    """Counts skipped (non-finite) steps in a row within one `train` call; stops training at the limit."""

    def __init__(self, trainer: "Trainer"):
        self.trainer = trainer
        self.in_a_row = 0

    def skipped(self) -> None:
        self.in_a_row += 1
        if self.in_a_row >= self.trainer.train_cfg.max_nonfinite_steps:
            trainer = self.trainer
            # Every finished step left the LoRA finite (the recipe checks), and skipped steps change nothing.
            raise TrainingStopped(
                f"training stopped at step {trainer.step}: {self.in_a_row} steps in a row had a NaN/inf loss or "
                f"gradient, so they were skipped and the LoRA is unchanged since step {trainer.step}."
                f"{lora_file_note(trainer)} Try a lower learning rate, keep max_grad_norm on, train the LoRA in "
                "float32, or check the dataset for broken images.")

    def finished(self) -> None:
        self.in_a_row = 0


def undo_nonfinite_step(trainer: "Trainer") -> None:
    """The optimizer step just taken made LoRA values NaN/inf: put back the newest checkpoint with finite
    values (LoRA, optimizer state, micro-batch counter) and stop; with none, refuse further use. Raises."""
    failed = trainer.step + 1
    bad = nonfinite_names(dict(zip(trainer.param_names, trainer.params)))
    what = (f"training stopped: optimizer step {failed} made {len(bad)} LoRA tensors NaN/inf (first: {bad[:2]})"
            f" although its loss and gradient were finite.{lora_file_note(trainer)}")
    notes: list[str] = []
    error = ""
    try:
        restored = trainer.resume(notes)
    except Exception as e:  # noqa: BLE001 (the run folder changed under us: say so below)
        restored, error = False, f" (reading it failed: {e})"
    if restored:
        lost = (f"; steps {trainer.step + 1} to {failed} are undone" if trainer.step + 1 < failed
                else f"; step {failed} is undone")
        raise TrainingStopped(
            f"{what} The LoRA and its optimizer state were restored from the checkpoint of step {trainer.step} "
            f"({trainer.restored_from}), the newest with finite values{lost}. {ADVICE}"
            + (f" ({' '.join(notes)})" if notes else ""))
    where = (f"its run folder {trainer.run_dir} holds no checkpoint with finite values{error}"
             if trainer.run_dir is not None else "this trainer has no run folder, so no checkpoint")
    trainer.broken_reason = (
        f"{what} It could not be undone: {where}. The LoRA in memory is unusable; nothing was written from it "
        f"and this trainer refuses to train or save. Start the run again (queue again with a lower learning "
        f"rate, or use a new run_name). {ADVICE}")
    raise TrainingStopped(trainer.broken_reason)


def lora_file_note(trainer: "Trainer") -> str:
    if trainer.init_lora is None:
        return ""
    return f" This run continued from LoRA file {trainer.init_lora.path}."
