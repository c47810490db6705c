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

Training is step-chunked: `train(n)` runs n more optimizer steps. Every random draw is a pure function of (seed,
micro-batch, purpose): k chunks equal one call bit for bit, across a resume and over several processes too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from PIL import Image

from ..adapters.lora_files import LoraFile
from ..core.config import LoraConfig, OptimizerConfig, TrainConfig
from ..core.errors import TrainingStopped, UserInputError
from ..core.finite import all_finite
from ..data.cache import CachedDataset
from ..models.components import QwenImageComponents
from ..streaming.placement import MODULATION_WINDOW
from . import evaluation, guards, lifecycle, outputs, periodic, randomness, setup, state
from .busy import Busy, holds, run_description
from .comparison import DEFAULT as DEFAULT_COMPARISON
from .comparison import Comparison
from .distributed import ONE_PROCESS, Replicas
from .live import PreviewSettings, StepPreview
from .optim import set_learning_rate
from .reports import StepReport, TrainReport
from .weighting import DatasetLosses, record_dataset_losses, reports_datasets


class Trainer:
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
        self.components, self.dataset, self.comparison = components, dataset, comparison
        self.modulation_window = MODULATION_WINDOW if comparison.modulation_ahead else 0  # 0: off, same results
        self.lora_cfg, self.optim_cfg, self.train_cfg = lora, optimizer, train
        self.requested_lora_cfg, self.requested_train_cfg = lora, train  # as asked: before a LoRA file's rank, 'auto
        self.run_dir, self.replicas = (Path(run_dir) if run_dir is not None else None), replicas
        self.device, self.compute_dtype = components.device, components.compute_dtype
        self.transformer = components.transformer  # None until setup.build loads it (a lazy model set)
        self.params: list[torch.nn.Parameter] = []
        self.runner = self.optimizer = self.ema = self.lock = self.flow = None  # ema: ema.WeightAverage, when on
        self.host_copy = None  # with several processes on a machine: its shared host copy (host_copy.py)
        self.init_lora: LoraFile | None = None
        self.retired_reason: str | None = None  # why this trainer may no longer be used (`retire`)
        self.step = 0  # optimizer steps finished
        self.micro_batches = 0  # micro-batches drawn, over all processes: the data order's and randomness' counter
        self.saved_step: int | None = None  # step of the newest checkpoint on disk
        self.restored_from: Path | None = None  # the checkpoint folder `resume` last read
        self.loss_history: list[tuple[int, float]] = []
        # (step, {dataset label: its samples' mean loss}) when the report lists datasets (weighting.py)
        self.dataset_loss_history: list[tuple[int, dict[str, float]]] = []
        self.validation_history: list[tuple[int, float]] = []  # (step, validation loss)
        self.step_previews: list[StepPreview] = []  # small copies of previews made while training (live.py caps them)
        self.resume_notes: list[str] = []  # checkpoints `resume` passed over, one sentence each, for a person
        self.broken_reason: str | None = None  # a step made the LoRA non-finite, nothing could undo it (guards.py)
        self.busy = Busy(run_description(self))  # one place at a time
        lifecycle.claim_model_set(self)
        try:
            lifecycle.lock_run_folder(self)  # before anything touches the model
            setup.build(self, init_lora, preview_size)
        except BaseException:
            self.close()  # the model without a half-made adapter, the run folder unlocked
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
        skipped = guards.SkippedSteps(self)
        started = time.perf_counter()
        self.transformer.train()
        with randomness.global_rng_kept(self.device):
            try:
                while report.steps < n_steps:
                    self._plan_modulation_ahead(n_steps - report.steps)
                    step = self._one_step()
                    if step.skipped:
                        report.skipped += 1
                        skipped.skipped()  # raises after max_nonfinite_steps in a row
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
                self.runner.forget_modulation()  # planned for this call's steps: a later call plans its own
                self.transformer.eval()
                report.seconds = time.perf_counter() - started
        return report

    def _one_step(self) -> StepReport:
        started = time.perf_counter()
        # A step takes grad_accum_steps micro-batches per process: micro-batch k of the step is process
        # k mod N's (distributed.py), and each process draws only its own (randomness.py).
        share = self.train_cfg.grad_accum_steps * self.replicas.size
        first, self.micro_batches = self.micro_batches, self.micro_batches + share
        total, finite = 0.0, True
        tally = DatasetLosses() if reports_datasets(self.dataset.samples) else None  # this process's samples
        for k in range(share):
            if not self.replicas.owns(k):
                continue
            batch = self.flow.draw(first + k)
            randomness.seed_global_rng(self.train_cfg.seed, first + k, self.device)  # LoRA dropout's masks
            loss = self.flow.loss(batch, tally)
            del batch  # its latents and noise: not kept through backward (the memory plan counts them as gone)
            if not torch.isfinite(loss):
                finite = False
                continue
            (loss / share).backward()
            total += loss.item()
        total, finite = self.replicas.reduce_step(self.params, total, finite)  # summed over the processes
        grad_norm = self._clip_gradients() if finite else math.nan
        lr = set_learning_rate(self.optimizer, self.optim_cfg, self.step)
        if not (finite and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            return StepReport(step=self.step, loss=math.nan, lr=lr, grad_norm=grad_norm,
                              seconds=time.perf_counter() - started, skipped=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not all_finite(self.params):  # one fused reduction and one host sync per step
            guards.undo_nonfinite_step(self)  # raises
        self.step += 1
        self.loss_history.append((self.step, total / share))
        datasets = record_dataset_losses(tally, self.step, self.dataset_loss_history)
        return StepReport(step=self.step, loss=total / share, lr=lr, grad_norm=grad_norm,
                          seconds=time.perf_counter() - started, datasets=datasets)

    def _plan_modulation_ahead(self, steps_left: int) -> None:
        """With streamed blocks, hand the block runner the timesteps of this process's next training forwards
        (at most a modulation window's, within this call's steps) once it has none left: their streamed blocks
        are then copied without the modulation weights (streaming.runner.BlockRunner.plan_modulation). The timesteps are
        pure functions of the micro-batch counter, so nothing is drawn twice or replayed."""
        if self.runner.swapper is None or self.runner.planned_forwards or not self.modulation_window:
            return
        per_step = self.train_cfg.grad_accum_steps
        share = per_step * self.replicas.size
        steps = max(1, min(steps_left, self.modulation_window // per_step))
        numbers = [self.micro_batches + s * share + k for s in range(steps) for k in range(share)
                   if self.replicas.owns(k)]
        self.runner.plan_modulation([self.flow.planned_timesteps(m) for m in numbers])

    def _clip_gradients(self) -> float:
        max_norm = self.optim_cfg.max_grad_norm
        if max_norm > 0:
            return float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        norms = [p.grad.detach().float().norm() for p in self.params if p.grad is not None]
        return float(torch.stack(norms).norm()) if norms else 0.0

    # -- components' entry points -------------------------------------------------------------------

    def validation_loss(self) -> float:
        return evaluation.validation_loss(self)

    @holds("a checkpoint")
    def save_checkpoint(self) -> Path | None:
        return state.save_checkpoint(self)

    def checkpoint_if_behind(self) -> None:
        state.checkpoint_if_behind(self)

    @holds("resuming from a checkpoint")
    def resume(self, notes: list[str] | None = None) -> bool:
        """Continue from the newest usable checkpoint in `run_dir`; False when there is none (state.py)."""
        return state.resume(self, self.resume_notes if notes is None else notes)

    @holds("reading its LoRA")
    def lora_state_dict(self, dtype: torch.dtype = torch.bfloat16, layout: str = "comfyui") -> dict[str, torch.Tensor]:
        return outputs.lora_state_dict(self, dtype, layout)

    def lora_metadata(self, layout: str = "comfyui") -> dict[str, str]:
        return outputs.lora_metadata(self, layout)

    @holds("Save LoRA")
    def save_lora(self, path, dtype: torch.dtype = torch.bfloat16, layout: str = "comfyui") -> Path:
        return outputs.save_lora(self, path, dtype, layout)

    @holds("Preview")
    def sample_preview(self, prompt: str, negative_prompt: str = "", width: int = 1024, height: int = 1024,
                       steps: int = 20, cfg_scale: float = 4.0, seed: int = 0,
                       progress: Callable[[int, int], None] | None = None,
                       control_images: list[Image.Image] | None = None, weights: str = "raw") -> Image.Image:
        return outputs.sample_preview(self, prompt, negative_prompt, width, height, steps, cfg_scale, seed,
                                      progress, control_images, weights)

    def preview_step(self, settings: PreviewSettings, progress: Callable[[int, int], None] | None = None
                     ) -> StepPreview:
        return outputs.preview_step(self, settings, progress)

    @property
    def live(self) -> bool:
        return self.retired_reason is None

    def require_live(self) -> None:  # raise why this trainer was retired (its model taken, or released)
        if self.retired_reason is not None:
            raise UserInputError(self.retired_reason)

    @holds("retiring it (Release, or an Init Trainer that takes its model)", nests=False)
    def retire(self, reason: str, unpin: bool = False) -> None:
        lifecycle.retire(self, reason, unpin)

    @holds("closing it")
    def close(self, unpin: bool = False) -> None:
        lifecycle.close(self, unpin)

    def last_loss(self) -> float:
        return self.loss_history[-1][1] if self.loss_history else math.nan
