"""What training hands back: a report per optimizer step (to periodic work and hosts) and one per `train` call."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .live import StepPreview
from .weighting import DatasetLoss


@dataclass
class StepReport:
    step: int  # 1-based number of the optimizer step just finished
    loss: float  # mean over the step's micro-batches
    lr: float
    grad_norm: float
    seconds: float
    skipped: bool = False  # non-finite loss or gradient: no update was made
    preview: StepPreview | None = None  # sampled after this step (periodic work: periodic.StepExtras)
    snapshot: Path | None = None  # LoRA file written after this step (periodic work: periodic.StepExtras)
    # Per dataset (its label) its samples' mean loss in this step, when the run reports datasets (weighting.py:
    # several datasets, a weighted or a regularisation one); this process's samples in a data-parallel run.
    datasets: dict[str, DatasetLoss] | None = None


@dataclass
class TrainReport:
    first_step: int
    last_step: int
    losses: list[float] = field(default_factory=list)
    skipped: int = 0
    seconds: float = 0.0  # all of it: steps, checkpoints, previews and snapshots
    previews: list[tuple[int, float]] = field(default_factory=list)  # (step, seconds sampling took)
    snapshots: list[Path] = field(default_factory=list)
    extra_seconds: float = 0.0  # periodic work that is not training (previews, snapshots)

    @property
    def step_seconds(self) -> float:
        """Seconds per step, previews and snapshots left out."""
        return (self.seconds - self.extra_seconds) / max(1, self.steps)

    @property
    def steps(self) -> int:
        return len(self.losses)

    @property
    def mean_loss(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else float("nan")
