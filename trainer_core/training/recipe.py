"""The training recipe: the Trainer, which owns the model's adapter, the optimizer, the schedule and the data
order, and runs the loop over components that do one thing each:

    claim the model set and the run folder ......... lifecycle.py
    build: plan, adapter, block runner, optimizer .. setup.py
    for each optimizer step:
        draw -> loss -> backward (own micro-batches)  step.py, randomness.py
        reduce over processes, clip, optimizer step . distributed.py, optim.py
        guard against NaN/inf ....................... guards.py
        periodic work (EMA, validation, checkpoints, previews, snapshots, progress)  periodic.py, ema.py
    checkpoint / resume: state.py; validation: evaluation.py; LoRA files and previews: outputs.py
    close / retire .................................. lifecycle.py

The components take what they touch, not the Trainer. The Trainer's shape (every attribute) is declared in one
place, base.TrainerBase, with the entry points that hand the components their pieces; this module builds the
parts and runs the loop.

Training is step-chunked: `train(n)` runs n more optimizer steps. Every random draw is a pure function of (seed,
micro-batch, purpose): k chunks equal one call bit for bit, across a resume and over several processes too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ..core.config import LoraConfig, OptimizerConfig, TrainConfig
from ..core.errors import TrainingStopped
from ..core.finite import all_finite
from ..core.host_read import read_to_host
from ..data.cache import CachedDataset
from ..models.components import QwenImageComponents
from . import guards, lifecycle, periodic, randomness, setup
from .base import TrainerBase
from .busy import holds
from .comparison import DEFAULT as DEFAULT_COMPARISON
from .comparison import Comparison
from .distributed import ONE_PROCESS, Replicas
from .optim import set_learning_rate
from .reports import StepReport, TrainReport
from .weighting import DatasetLosses, record_dataset_losses, reports_datasets


class Trainer(TrainerBase):
    def __init__(self, components: QwenImageComponents, dataset: CachedDataset, lora: LoraConfig,
                 optimizer: OptimizerConfig, train: TrainConfig, run_dir: str | Path | None = None,
                 init_lora: str | Path | None = None, replicas: Replicas = ONE_PROCESS,
                 preview_size: tuple[int, int] | None = None, comparison: Comparison = DEFAULT_COMPARISON):
        """`run_dir`: where checkpoints go (None: no checkpoints). `replicas`: this process's place among
        data-parallel processes (distributed.py); only process 0 locks the run folder and writes checkpoints.
        `preview_size`: (width, height) of the previews this run will sample, for the memory plan (None: the
        Preview node's default). `init_lora`: continue from this LoRA file (any layout lora_files reads): it
        decides rank, alpha and the adapted modules; the optimizer, schedule and step count start fresh.
        `comparison`: a build that differs from the default in one respect, for benchmarks (comparison.py)."""
        setup.check_inputs(components, dataset, train)  # the settings themselves are valid once made
        run_dir = Path(run_dir) if run_dir is not None else None
        super().__init__(components, dataset, lora, optimizer, train, run_dir, replicas, comparison)
        lifecycle.claim_model_set(components, self)
        try:  # the run folder first, before anything touches the model
            self.lock = lifecycle.lock_run_folder(run_dir, replicas.writes, train.run_name)
            self.decided = setup.decide(components, dataset, lora, optimizer, train, init_lora, preview_size,
                                        replicas.local_size)
            self.built = setup.build(components, dataset, self.decided, optimizer, train, replicas, comparison,
                                     keeps_checkpoints=run_dir is not None)
        except BaseException:
            self.close()  # the model set free again, the run folder unlocked
            raise

    # -- the loop --------------------------------------------------------------------------------------

    @holds("Train Steps", nests=False)
    def train(self, n_steps: int, on_step: Callable[[StepReport], None] | None = None,
              work: Sequence[periodic.Every] = ()) -> TrainReport:
        """Run `n_steps` more optimizer steps. `work`: periodic work after the steps it is due at (periodic.py);
        `on_step`: a callback after every step (work due every step, run last). Either may raise (a ComfyUI
        interrupt, say) to stop at that step boundary: the trainer checkpoints and stays usable."""
        self.require_live()
        if self.broken_reason is not None:
            raise TrainingStopped(self.broken_reason)
        work = [*periodic.training_work(self), *work, *([periodic.every(1, on_step)] if on_step else [])]
        report = TrainReport(first_step=self.step + 1, last_step=self.step)
        skipped = guards.SkippedSteps(self.train_cfg.max_nonfinite_steps, self.decided.continued_from)
        started = time.perf_counter()
        self.built.transformer.train()
        with randomness.global_rng_kept(self.device):
            try:
                while report.steps < n_steps:
                    self._plan_modulation_ahead(n_steps - report.steps)
                    step = self._one_step()
                    if step.skipped:
                        report.skipped += 1
                        skipped.skipped(self.step)  # raises after max_nonfinite_steps in a row
                        continue
                    skipped.finished()
                    report.losses.append(step.loss)
                    report.last_step = self.step
                    periodic.run_due(work, self, step, report)
            except BaseException:
                # Interrupted or failed: every finished step to disk; a checkpoint failure must not replace the error
                try:
                    self.checkpoint_if_behind()
                except Exception:  # noqa: BLE001
                    pass
                raise
            else:
                self.checkpoint_if_behind()
            finally:
                self.built.runner.forget_modulation()  # planned for this call's steps: a later call plans its own
                self.built.transformer.eval()
                report.seconds = time.perf_counter() - started
        return report

    def _one_step(self) -> StepReport:
        started = time.perf_counter()
        built, progress = self.built, self.progress
        # A step takes grad_accum_steps micro-batches per process: micro-batch k of the step is process
        # k mod N's (distributed.py), and each process draws only its own (randomness.py).
        share = self.train_cfg.grad_accum_steps * self.replicas.size
        first, progress.micro_batches = progress.micro_batches, progress.micro_batches + share
        # The losses' sum (float64: the same sum as Python floats of each loss) and whether all were finite stay on
        # the device until the step's one read below: no host sync per micro-batch.
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        finite_on_device = torch.ones((), dtype=torch.bool, device=self.device)
        tally = DatasetLosses() if reports_datasets(self.dataset.samples) else None  # this process's samples
        for k in range(share):
            if not self.replicas.owns(k):
                continue
            batch = built.flow.draw(first + k)
            randomness.seed_global_rng(self.train_cfg.seed, first + k, self.device)  # LoRA dropout's masks
            loss = built.flow.loss(batch, tally)
            del batch  # its latents and noise: not kept through backward (the memory plan counts them as gone)
            # A NaN/inf loss's backward makes NaN gradients: the step is then skipped below and they are dropped,
            # as when its backward was not run.
            (loss / share).backward()
            finite_on_device &= torch.isfinite(loss.detach())
            loss_sum += loss.detach().double()
        if self.replicas.size > 1:  # the all-reduce waits for the device anyway
            total, finite = read_to_host(torch.stack([loss_sum, finite_on_device.double()]))
            total, finite = self.replicas.reduce_step(built.params, total if finite else 0.0, bool(finite))
            grad_norm = self._clip_gradients() if finite else math.nan
        else:  # the step's one read: loss, finiteness and gradient norm together
            norm = self._gradient_norm_on_device()
            total, finite, grad_norm = read_to_host(torch.stack([loss_sum, finite_on_device.double(), norm.double()]))
            finite = bool(finite)
            total, grad_norm = (total, grad_norm) if finite else (0.0, math.nan)
        lr = set_learning_rate(built.optimizer, self.optim_cfg, progress.step)
        if not (finite and math.isfinite(grad_norm)):
            built.optimizer.zero_grad(set_to_none=True)
            return StepReport(step=progress.step, loss=math.nan, lr=lr, grad_norm=grad_norm,
                              seconds=time.perf_counter() - started, skipped=True)
        built.optimizer.step()
        built.optimizer.zero_grad(set_to_none=True)
        if not all_finite(built.params):  # one fused reduction and one host sync per step
            self._undo_nonfinite_step()  # raises
        progress.step += 1
        progress.loss_history.append((progress.step, total / share))
        datasets = record_dataset_losses(tally, progress.step, progress.dataset_loss_history)
        return StepReport(step=progress.step, loss=total / share, lr=lr, grad_norm=grad_norm,
                          seconds=time.perf_counter() - started, datasets=datasets)

    def _plan_modulation_ahead(self, steps_left: int) -> None:
        """With streamed blocks, hand the block runner the timesteps of this process's next training forwards
        (at most a modulation window's, within this call's steps) once it has none left: their streamed blocks
        are then copied without the modulation weights (streaming.runner.BlockRunner.plan_modulation). The timesteps are
        pure functions of the micro-batch counter, so nothing is drawn twice or replayed."""
        runner = self.built.runner
        if runner.swapper is None or runner.planned_forwards or not self.modulation_window:
            return
        per_step = self.train_cfg.grad_accum_steps
        share = per_step * self.replicas.size
        steps = max(1, min(steps_left, self.modulation_window // per_step))
        numbers = [self.progress.micro_batches + s * share + k for s in range(steps) for k in range(share)
                   if self.replicas.owns(k)]
        runner.plan_modulation([self.built.flow.planned_timesteps(m) for m in numbers])

    def _clip_gradients(self) -> float:
        return float(self._gradient_norm_on_device())

    def _gradient_norm_on_device(self) -> torch.Tensor:
        """The LoRA gradients' total norm (a 0-d tensor on the device, not read), clipped to max_grad_norm when
        that is set. A non-finite norm makes the clipped gradients NaN: the step is then skipped."""
        max_norm, params = self.optim_cfg.max_grad_norm, self.built.params
        if max_norm > 0:
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        norms = [p.grad.detach().float().norm() for p in params if p.grad is not None]
        return torch.stack(norms).norm() if norms else torch.zeros((), device=self.device)

    def _undo_nonfinite_step(self) -> None:
        """The optimizer step just taken made LoRA values NaN/inf: the newest checkpoint with finite values puts
        the run back, or else this trainer refuses further use (guards.py). Raises."""
        def restore(notes: list[str]) -> tuple[int, Path] | None:
            return (self.step, self.restored_from) if self.resume(notes) else None

        built = self.built
        self.broken_reason = guards.undo_nonfinite_step(
            self.step + 1, dict(zip(built.param_names, built.params)), self.decided.continued_from, self.run_dir,
            restore)  # raises where the checkpoint undid it
        raise TrainingStopped(self.broken_reason)
