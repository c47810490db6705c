"""The Trainer's shape and its entry points: every attribute a trainer has, declared in one place, and the calls
that hand the components (state.py, outputs.py, evaluation.py, lifecycle.py) the pieces they touch.

    settings, as asked ........ lora_cfg, optim_cfg, train_cfg (the run, its folder, its processes)
    decided, built ............ setup.Decided (swap count, the adapter's rank...), setup.Built (the parts)
    progress .................. state.Progress (step, micro-batch counter, histories), its checkpoints on disk
    live previews ............. the schedule its host set, the small copies kept
    its life .................. the run folder's lock, busy, retired or broken

The recipe (recipe.Trainer) builds the parts and runs the loop; this class holds them and gives them out. It claims
nothing and builds nothing itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image

from ..core.config import LoraConfig, OptimizerConfig, TrainConfig
from ..core.errors import RunFolderLost, TrainingStopped, UserInputError
from ..core.host_memory import give_back_freed_memory
from ..core.run_lock import RunLock
from ..data.cache import CachedDataset
from ..models.components import QwenImageComponents
from ..streaming.placement import MODULATION_WINDOW
from . import evaluation, lifecycle, outputs, setup, state
from .busy import Busy, holds, run_description
from .comparison import Comparison
from .data_record import data_record
from .distributed import Replicas
from .live import PreviewMovement, PreviewSettings, StepPreview
from .periodic import StepExtras


class TrainerBase:
    def __init__(self, components: QwenImageComponents, dataset: CachedDataset, lora: LoraConfig,
                 optimizer: OptimizerConfig, train: TrainConfig, run_dir: Path | None, replicas: Replicas,
                 comparison: Comparison):
        # The settings, as asked. optim_cfg may be replaced between `train` calls: it applies from the next step.
        self.lora_cfg, self.optim_cfg, self.train_cfg = lora, optimizer, train
        self.components, self.dataset = components, dataset  # None once retired
        self.run_dir, self.replicas, self.comparison = run_dir, replicas, comparison
        self.device = components.device
        self.modulation_window = MODULATION_WINDOW if comparison.modulation_ahead else 0  # 0: off, same results
        # What the engine decided from the settings, and the parts it built (setup.py): None until the recipe has
        # made them; `built` None again once closed.
        self.decided: setup.Decided | None = None
        self.built: setup.Built | None = None
        # How far the run is (state.py), and its checkpoints on disk.
        self.progress = state.Progress()
        self.saved_step: int | None = None  # step of the newest checkpoint on disk
        self.restored_from: Path | None = None  # the checkpoint folder `resume` last read
        self.resume_notes: list[str] = []  # checkpoints `resume` passed over, one sentence each, for a person
        # The live previews: the schedule its host set last (`schedule_previews`: every N steps, 0 = off) and small
        # copies of the previews made while training (live.py caps them).
        self.preview_every = 0
        self.step_previews: list[StepPreview] = []
        self.preview_movement = PreviewMovement()  # the pictures the next preview is measured against
        self.preview_notes: list[str] = []  # why earlier previews did not come back on a resume (saved_previews.py)
        # Its life.
        self.lock: RunLock | None = None  # the run folder's (lifecycle.lock_run_folder), where checkpoints are written
        self.retired_reason: str | None = None  # why this trainer may no longer be used (`retire`)
        self.broken_reason: str | None = None  # a step made the LoRA non-finite, nothing could undo it (guards.py)
        self.busy = Busy(run_description(self))  # one place at a time

    @property
    def step(self) -> int:
        """Optimizer steps finished: where the run is."""
        return self.progress.step

    @property
    def memory_plan(self) -> str:
        """The memory plan that placed the blocks, and the block runner's statuses, for a person."""
        return "\n".join([self.decided.swap.text, *self.built.notes])

    def last_loss(self) -> float:
        history = self.progress.loss_history
        return history[-1][1] if history else math.nan

    # -- checkpoints (state.py) -----------------------------------------------------------------------

    @holds("a checkpoint")
    def save_checkpoint(self) -> Path | None:
        if self.run_dir is None:
            return None
        tensors, meta = state.training_state(self.progress, self.built, self.decided, self.optim_cfg, self.train_cfg,
                                             self.components.name, len(self.dataset.samples), self.replicas.size,
                                             data=self._data_record())
        folder = state.save_checkpoint(self.run_dir, self.lock, self.replicas.writes, self.step, tensors, meta)
        self.saved_step = self.step
        del tensors  # the CPU copies (LoRA, optimizer state): thousands of small tensors, back to the system
        give_back_freed_memory()
        return folder

    def checkpoint_if_behind(self) -> None:
        """A checkpoint of the current step unless the newest on disk is of it (or nothing finite is left to keep:
        then the last good checkpoint stays the newest)."""
        if self.broken_reason is None and self.run_dir is not None and self.saved_step != self.step:
            self.save_checkpoint()

    def _data_record(self) -> dict | None:
        """The record of the data this trainer trains on, for its checkpoints (data_record.py)."""
        return data_record(self.dataset) if self.dataset is not None else None

    @holds("resuming from a checkpoint")
    def resume(self, notes: list[str] | None = None) -> bool:
        """Continue from the newest usable checkpoint in `run_dir`; False when there is none (state.py)."""
        if self.run_dir is None:
            return False
        resumed = state.resume(self.run_dir, self.resume_notes if notes is None else notes, self.built, self.decided,
                               self.optim_cfg, self.train_cfg, self.components.name, self.replicas.size,
                               data=self._data_record())
        if resumed is None:
            return False
        self.progress, self.restored_from = resumed
        self.saved_step = self.step
        self.broken_reason = None
        self.step_previews = [p for p in self.step_previews if p.step <= self.step]  # none of undone steps
        return True

    # -- what it gives out (outputs.py, evaluation.py) ------------------------------------------------

    def validation_loss(self) -> float:
        return evaluation.validation_loss(self.built.flow, self.built.optimizer)

    @holds("reading its LoRA")
    def lora_state_dict(self, dtype: torch.dtype = torch.bfloat16, layout: str = "comfyui") -> dict[str, torch.Tensor]:
        self._require_usable()
        return outputs.lora_state_dict(self.built, self.decided.lora, self.train_cfg.run_name, dtype, layout)

    def lora_metadata(self, layout: str = "comfyui") -> dict[str, str]:
        return outputs.lora_metadata(self.built, self.decided, self.train_cfg.run_name, self.step,
                                     self.components.name, layout, base_licence=self.components.family.weights_licence)

    @holds("Save LoRA")
    def save_lora(self, path, dtype: torch.dtype = torch.bfloat16, layout: str = "comfyui") -> Path:
        self._require_usable()
        return outputs.save_lora(self.built, self.decided, self.train_cfg.run_name, self.step, self.components.name,
                                 path, dtype, layout, self.components.family.weights_licence)

    @holds("Preview")
    def sample_preview(self, prompt: str, negative_prompt: str = "", width: int = 1024, height: int = 1024,
                       steps: int = 20, cfg_scale: float = 4.0, seed: int = 0,
                       progress: Callable[[int, int], None] | None = None,
                       control_images: list[Image.Image] | None = None, weights: str = "raw") -> Image.Image:
        self.require_live()
        return outputs.sample_preview(self.components, self.dataset, self.built, self.train_cfg.run_name, prompt,
                                      negative_prompt, width, height, steps, cfg_scale, seed, progress,
                                      control_images, weights)

    def preview_step(self, settings: PreviewSettings, progress: Callable[[int, int], None] | None = None
                     ) -> StepPreview:
        self.require_live()
        return outputs.preview_step(self.components, self.dataset, self.built, self.train_cfg.run_name, self.step,
                                    self.step_previews, settings, progress)

    def measure_preview(self, preview: StepPreview) -> None:
        """How far the live preview of this step (full size) moved from the untrained one and the previous one, into
        `progress.preview_history` (the report's and the loss plot's; live.PreviewMovement)."""
        from_untrained, from_previous = self.preview_movement.measure(preview)
        history = [h for h in self.progress.preview_history if h[0] != preview.step]
        self.progress.preview_history = [*history, (preview.step, from_untrained, from_previous)]

    def schedule_previews(self, extras: StepExtras) -> None:
        """The live preview schedule its host follows from now on (Train Steps: its widgets): `preview_every` says
        it to whoever shows the previews (Compare Steps: when the first comes)."""
        self.preview_every = extras.preview_every if extras.previews else 0

    # -- its life (lifecycle.py) ----------------------------------------------------------------------

    @property
    def live(self) -> bool:
        return self.retired_reason is None

    def require_live(self) -> None:  # raise why this trainer was retired (its model taken, or released)
        if self.retired_reason is not None:
            raise UserInputError(self.retired_reason)

    def _require_usable(self) -> None:  # live, and its LoRA finite: nothing is given out of a broken one
        self.require_live()
        if self.broken_reason is not None:
            raise TrainingStopped(self.broken_reason)

    @holds("retiring it (Release, or an Init Trainer that takes its model)", nests=False)
    def retire(self, reason: str, unpin: bool = False) -> None:
        """Checkpoint, give the model back (`close`), let go of the model set and the dataset, and refuse any
        further use with `reason`. The progress stays (a loss plot still works)."""
        if self.retired_reason is not None:
            return
        if self.built is not None:
            try:
                self.checkpoint_if_behind()  # if this fails (a full disk) nothing is retired: no step is lost
            except RunFolderLost:
                pass  # another trainer owns the folder now: writing there would mix two runs' checkpoints
        self.retired_reason = reason
        self._close(unpin)
        self.components = self.dataset = None

    @holds("closing it")
    def close(self, unpin: bool = False) -> None:
        """Give the transformer back as it was, drop the built parts and unlock the run folder (lifecycle.py)."""
        self._close(unpin)

    def _close(self, unpin: bool) -> None:
        if self.components is None:  # retired: closed already
            return
        lifecycle.close(self.components, self, self.built, self.lock, self.device, unpin)
        self.built = None
