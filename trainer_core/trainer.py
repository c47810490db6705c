"""The Trainer: owns the model with its adapter, the optimizer, the schedule, the RNG and the data order.

Training is step-chunked: `train(n)` runs n more optimizer steps and returns a report. Nothing is
re-seeded or rebuilt between calls, so k chunks give bit-identical weights to one call of the same
total length. Every random draw (noise, noise level, caption dropout) comes from one CPU generator
owned by the trainer, in a fixed order, and LoRA dropout's global RNG is seeded for each micro-batch
from the run's seed, the step and the micro-batch's place in it, so results depend neither on the device's
RNG nor on what other code draws in between, nor on how many processes share the step (distributed.py).

With a `run_dir`, the whole state is checkpointed (see checkpoint.py) every `checkpoint_every` steps
and whenever `train` returns or is interrupted, and `resume()` continues bit-exactly from the newest
checkpoint, also in a new process.

Nothing non-finite is kept or written: a step with a NaN/inf loss or gradient is skipped (several in a
row stop training); a step whose update makes a LoRA value NaN/inf (one fused check after every optimizer
step) is undone by restoring the newest checkpoint with finite values, and training stops saying so (with
no such checkpoint the trainer refuses further use); a checkpoint with NaN/inf is never written, and
`resume` passes over one (see checkpoint.load_latest).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image

from . import checkpoint as ckpt
from .batching import DataOrder
from .cache import CachedDataset
from .config import LoraConfig, OptimizerConfig, TrainConfig, from_dict, to_dict
from .distributed import ONE_PROCESS, Replicas, world_size_note
from .errors import RunFolderLost, TrainingStopped, UserInputError
from .files import remove_leftovers, write_error, write_safetensors_atomic
from .finite import all_finite, nonfinite_names
from .lora import compute_in_input_dtype, inject_lora, matching_preset, remove_lora, target_module_names
from .lora_files import LoraFile, check_targets, layout_metadata, load_into_adapter, lora_file_tensors, lora_metadata, read_lora_file
from .planner.for_run import plan_run
from .models.components import QwenImageComponents, module_fingerprint
from .models.latents import pack_latents
from .models.qwen_arch import PATCH_SIZE
from .models.text import pad_prompt_batch
from .objective import flow_loss, noisy_latents, resolution_mu, sample_noise_levels, time_shift, velocity_target
from .offload import BlockRunner, swapped_blocks, uninstall_leftover_runner
from .comparison import DEFAULT as DEFAULT_COMPARISON, Comparison
from .swap_placement import MODULATION_WINDOW, default_placement, tail_placement
from .live import StepExtras, StepPreview, keep_preview
from .run_lock import RunLock
from .sampling import sample_image
from .optim import build_optimizer, set_learning_rate
from .edit.cache import sample_controls  # Qwen-Image-Edit hooks (trainer_core/edit/)
from .edit.objective import append_controls


@dataclass
class StepReport:
    step: int  # 1-based number of the optimizer step just finished
    loss: float  # mean over the step's micro-batches
    lr: float
    grad_norm: float
    seconds: float
    skipped: bool = False  # non-finite loss or gradient: no update was made
    preview: StepPreview | None = None  # sampled after this step (StepExtras.preview_every)
    snapshot: Path | None = None  # LoRA file written after this step (StepExtras.snapshot_every)


@dataclass
class TrainReport:
    first_step: int
    last_step: int
    losses: list[float] = field(default_factory=list)
    skipped: int = 0
    seconds: float = 0.0  # all of it: steps, checkpoints, previews and snapshots
    previews: list[tuple[int, float]] = field(default_factory=list)  # (step, seconds sampling took)
    snapshots: list[Path] = field(default_factory=list)
    extra_seconds: float = 0.0  # previews and snapshots

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


# The validation loss's fixed noise levels (before the resolution shift), spread over (0, 1), and the seed of
# its fixed noise (sample i draws from a generator seeded VALIDATION_SEED + i).
VALIDATION_LEVELS = (0.1, 0.3, 0.5, 0.7, 0.9)
VALIDATION_SEED = 20251130

# LoRA settings a checkpoint must agree on to be continued (anything else may change between runs).
MUST_MATCH_LORA = ("rank", "alpha", "targets", "dtype")


class Trainer:
    # Training forwards per modulation window when blocks are streamed (offload.BlockRunner.plan_modulation);
    # 0 switches modulation ahead off (same results, more bytes copied: for comparisons).
    modulation_window = MODULATION_WINDOW

    def __init__(
        self,
        components: QwenImageComponents,
        dataset: CachedDataset,
        lora: LoraConfig,
        optimizer: OptimizerConfig,
        train: TrainConfig,
        run_dir: str | Path | None = None,
        init_lora: str | Path | None = None,
        replicas: Replicas = ONE_PROCESS,
        preview_size: tuple[int, int] | None = None,
        comparison: Comparison = DEFAULT_COMPARISON,
    ):
        """`run_dir`: where checkpoints go (None: no checkpoints). `replicas`: this process's place among
        data-parallel processes (distributed.py); only process 0 locks the run folder and writes checkpoints.
        `preview_size`: (width, height) of the previews this run will sample, for the memory plan (None: the
        Preview node's default). `comparison`: a build that differs from the default in one respect, for
        benchmarks (comparison.py); same training, other costs.

        `init_lora`: continue from this LoRA file (any layout `lora_files.read_lora_file` reads). The file
        decides rank, alpha and the adapted modules (it holds the weights for exactly those; anything else
        would drop part of it or start part of it from scratch); dropout and dtype come from `lora`. The
        optimizer, schedule and step count start fresh: a LoRA file carries no optimizer state."""
        lora.validate()
        optimizer.validate()
        comparison.validate()
        self.comparison = comparison
        if not comparison.modulation_ahead:
            self.modulation_window = 0
        train.validate(num_blocks=components.num_blocks)
        if not dataset.samples:
            raise UserInputError("the cached dataset has no samples: check the Dataset node's folder.")
        self.components = components
        self.dataset = dataset
        self.lora_cfg, self.optim_cfg, self.train_cfg = lora, optimizer, train
        self.requested_lora_cfg = lora  # before a LoRA file to continue from replaces rank and alpha
        self.requested_train_cfg = train  # blocks_to_swap may say 'auto' here
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.replicas = replicas
        self.device = components.device
        self.compute_dtype = components.compute_dtype
        self.transformer = components.transformer  # None until _build loads it (a lazy model set)
        self.params: list[torch.nn.Parameter] = []
        self.runner: BlockRunner | None = None
        self.optimizer = None
        self.lock: RunLock | None = None
        # Why this trainer may no longer be used (set by `retire`); None while it is live.
        self.retired_reason: str | None = None
        self._claim_model_set()
        try:
            # One trainer per run folder, in this process or any other (before anything touches the model).
            if self.run_dir is not None and replicas.writes:
                self.lock = RunLock(self.run_dir)
                try:
                    self.lock.acquire(owner=f"run '{train.run_name}'")
                except OSError as e:
                    raise write_error(e, f"lock file of run '{train.run_name}'", self.run_dir,
                                      "Nothing was trained or changed.") from None
                ckpt.remove_leftovers(self.run_dir)  # what killed writes left (the folder is ours now)
            self._build(components, dataset, lora, optimizer, train, init_lora, preview_size)
        except BaseException:
            self.close()  # the model without a half-made adapter, the run folder unlocked
            raise

    def _claim_model_set(self) -> None:
        """A trainer owns its adapter, and a model set carries one adapter: refuse a second live trainer
        (`runs.open_run` retires the previous one first) rather than train each other's weights."""
        holder = self.components.trainer_ref() if self.components.trainer_ref is not None else None
        if holder is not None and holder.live:
            raise UserInputError(
                f"this model set is being trained by run '{holder.train_cfg.run_name}'; one loaded model trains one "
                "LoRA at a time. Retire or release that run first (runs.open_run does so), or load the model again."
            )
        leftover = holder is None and self.components.trainer_ref is not None  # a trainer dropped without close()
        if leftover and self.components.transformer is not None:
            uninstall_leftover_runner(self.components.transformer)
            remove_lora(self.components.transformer)
        self.components.trainer_ref = weakref.ref(self)

    def _build(self, components, dataset, lora, optimizer, train, init_lora, preview_size=None) -> None:
        self.base_fingerprint = components.fingerprint("transformer")  # before the adapter joins the model
        self.init_lora: LoraFile | None = None
        modules = None
        skeleton = components.skeleton()  # module names and shapes; the weights may not be read yet
        if init_lora is not None:
            self.init_lora = read_lora_file(init_lora)
            check_targets(skeleton, self.init_lora)
            modules = self.init_lora.targets
            self.lora_cfg = lora = dataclasses.replace(
                lora, rank=self.init_lora.rank, alpha=self.init_lora.alpha,
                targets=matching_preset(skeleton, modules) or lora.targets)
        self.lora_modules = modules or target_module_names(skeleton, lora.targets)
        # blocks_to_swap 'auto' becomes a number here, from the memory plan at the dataset's largest bucket
        # (against the device's free memory now: free other models first). A plan that does not fit is
        # refused here, before the transformer's weights are read.
        swap = plan_run(components, dataset, lora, optimizer, train, preview_size)
        self.memory_plan = swap.text
        self.train_cfg = train = dataclasses.replace(train, blocks_to_swap=swap.blocks_to_swap)
        # A lazy model set reads the transformer now, straight into this placement.
        self.transformer = components.ensure_transformer(
            self.device, host_blocks=swapped_blocks(components.num_blocks, train.blocks_to_swap))
        # Checkpoints name the base model they were trained on. A model set read from files names it by its
        # file's identity; checkpoints written before (when every model set was named by its weights) are
        # still continued: their name is the weights' fingerprint, taken here before the adapter joins.
        self.accepted_base_fingerprints = {self.base_fingerprint}
        if components.transformer_source is not None and self.run_dir is not None:
            self.accepted_base_fingerprints.add(module_fingerprint(self.transformer))
        self.params = inject_lora(self.transformer, lora, seed=train.seed, modules=self.lora_modules)
        # LoRA matmuls in the compute dtype, fp32 weights and updates
        compute_in_input_dtype(self.transformer, enabled=self.comparison.lora_compute == "compute dtype")
        if self.init_lora is not None:
            load_into_adapter(self.transformer, self.init_lora.weights)
            if not all_finite(self.params):  # finite in the file, but not once cast (float64 beyond float32's range)
                raise UserInputError(
                    f"LoRA file {self.init_lora.path} holds values too large for LoRA dtype {lora.dtype}: they become "
                    "inf. Choose another LoRA file.")
        self.param_names = [n for n, p in self.transformer.named_parameters() if p.requires_grad]
        place = tail_placement if self.comparison.placement == "tail" else default_placement
        placement = place(components.num_blocks, train.blocks_to_swap, swap.ring_depth)
        self.runner = BlockRunner(self.transformer, self.device, checkpointing=train.gradient_checkpointing,
                                  placement=placement if train.blocks_to_swap else None,
                                  fp8_activations=train.fp8_activations, compile_float8=train.compile_float8)
        if self.runner.swapper is not None:
            self.memory_plan += "\n" + self.runner.swapper.pinned_status
        if self.runner.fp8_status is not None:
            self.memory_plan += "\n" + self.runner.fp8_status
        if train.compile_float8:
            self.memory_plan += "\n" + ("compiled float8: on (the first step compiles)" if self.runner.compiled_float8
                                        else "compiled float8: off here (it needs a CUDA GPU with Triton); eager path")
        self.optimizer = build_optimizer(self.params, optimizer)
        self.rng = torch.Generator().manual_seed(train.seed)
        # LoRA dropout draws from torch's global RNG (of the device it runs on). The trainer keeps its own
        # copy of that state and installs it only while it trains.
        self.global_rng_state = _seeded_global_rng_state(train.seed, self.device)
        # Edit samples are batched by bucket and control sizes (EditCachedSample.batch_group).
        self.order = DataOrder([getattr(s, "batch_group", s.bucket) for s in dataset.samples], repeats=dataset.repeats,
                               batch_size=train.micro_batch_size, seed=train.seed)
        self.step = 0
        self.saved_step: int | None = None  # step of the newest checkpoint on disk
        self.restored_from: Path | None = None  # the checkpoint folder `resume` last read
        self.loss_history: list[tuple[int, float]] = []
        self.validation_history: list[tuple[int, float]] = []  # (step, validation loss), see validation_loss
        # Small copies of the previews made while training (StepExtras), for comparing steps (live.py caps them).
        self.step_previews: list[StepPreview] = []
        # Checkpoints `resume` passed over (unreadable, incomplete, NaN/inf), one sentence each, for a person.
        self.resume_notes: list[str] = []
        # Set when a step made the LoRA non-finite and no checkpoint could undo it: the LoRA in memory is
        # unusable, so training, checkpoints and LoRA files are refused with this message.
        self.broken_reason: str | None = None

    # ----------------------------------------------------------------------------------------------
    # training

    def train(self, n_steps: int, on_step: Callable[[StepReport], None] | None = None,
              extras: StepExtras | None = None) -> TrainReport:
        """Run `n_steps` more optimizer steps. `on_step` runs after each finished step and may raise (a
        ComfyUI interrupt, say) to stop at that step boundary: the trainer checkpoints and stays usable.
        `extras`: previews and LoRA snapshots every N steps, handed to `on_step` on its report; they leave
        the training itself bit-identical."""
        self.require_live()
        if self.broken_reason is not None:
            raise TrainingStopped(self.broken_reason)
        report = TrainReport(first_step=self.step + 1, last_step=self.step)
        started = time.perf_counter()
        bad_in_a_row = 0
        self.transformer.train()
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            _set_global_rng_state(self.global_rng_state, self.device)
            try:
                while report.steps < n_steps:
                    self._plan_modulation_ahead(n_steps - report.steps)
                    step_report = self._one_step()
                    self.global_rng_state = _global_rng_state(self.device)
                    if step_report.skipped:
                        report.skipped += 1
                        bad_in_a_row += 1
                        if bad_in_a_row >= self.train_cfg.max_nonfinite_steps:
                            self._stop_after_nonfinite(bad_in_a_row)
                        continue
                    bad_in_a_row = 0
                    report.losses.append(step_report.loss)
                    report.last_step = self.step
                    every = self.train_cfg.validation_every
                    if every and self.step % every == 0 and self.dataset.validation:
                        self.validation_history.append((self.step, self.validation_loss()))
                    every = self.train_cfg.checkpoint_every
                    if every and self.step % every == 0:
                        self.save_checkpoint()
                    if extras is not None:
                        self._step_extras(extras, step_report, report)
                    if on_step is not None:
                        on_step(step_report)
            except BaseException:
                # Interrupted or failed: keep every finished step on disk, then let the exception go on
                # (a checkpoint failure must not replace it; the state is still in memory).
                try:
                    self.checkpoint_if_behind()
                except Exception:  # noqa: BLE001
                    pass
                raise
            else:
                self.checkpoint_if_behind()
            finally:
                self.runner.forget_modulation()  # planned from this call's draws: a later call plans its own
                self.transformer.eval()
                report.seconds = time.perf_counter() - started
        return report

    def _step_extras(self, extras: StepExtras, step_report: StepReport, report: TrainReport) -> None:
        if extras.preview_due(self.step):
            t0 = time.perf_counter()
            step_report.preview = self.preview_step(extras.preview, progress=extras.on_sampling_step)
            _set_global_rng_state(self.global_rng_state, self.device)  # training draws on as if nothing sampled
            report.previews.append((self.step, step_report.preview.seconds))
            report.extra_seconds += time.perf_counter() - t0
        if extras.snapshot_due(self.step):
            t0 = time.perf_counter()
            step_report.snapshot = self.save_lora(extras.snapshot_path(self.step))
            report.snapshots.append(step_report.snapshot)
            report.extra_seconds += time.perf_counter() - t0

    def preview_step(self, settings, progress: Callable[[int, int], None] | None = None) -> StepPreview:
        """Sample `settings` (live.PreviewSettings) now, keep a small copy in `step_previews`, return it full
        size (sampling runs in eval mode, with its own generator)."""
        t0 = time.perf_counter()
        image = self.sample_preview(settings.prompt, settings.negative_prompt, settings.size, settings.size,
                                    settings.steps, settings.cfg, settings.seed, progress=progress)
        preview = StepPreview(self.step, image, time.perf_counter() - t0)
        keep_preview(self.step_previews, preview)
        return preview

    def _one_step(self) -> StepReport:
        t0 = time.perf_counter()
        # A step takes grad_accum_steps micro-batches per process. Every process draws all of them (one data
        # order, one generator) and computes its own share; see distributed.py. One process: all of them.
        share = self.train_cfg.grad_accum_steps * self.replicas.size
        total = 0.0
        finite = True
        for k in range(share):
            draw = self._draw(self.order.next())
            if not self.replicas.owns(k):
                continue
            # LoRA dropout draws from torch's global RNG: seeded per micro-batch, its masks depend on the run's
            # seed, the step and the micro-batch alone (not on which process computes it, nor on a resume).
            _seed_global_rng(micro_batch_seed(self.train_cfg.seed, self.step, k), self.device)
            loss = self._loss_of(draw)
            del draw  # its latents and noise: not kept through backward (the memory plan counts them as gone)
            if not torch.isfinite(loss):
                finite = False  # keep drawing the remaining micro-batches: data order and RNG stay in step
                continue
            (loss / share).backward()
            total += loss.item()
        total, finite = self.replicas.reduce_step(self.params, total, finite)  # summed over the processes
        grad_norm = self._clip_gradients() if finite else math.nan
        lr = set_learning_rate(self.optimizer, self.optim_cfg, self.step)
        if not (finite and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            return StepReport(step=self.step, loss=math.nan, lr=lr, grad_norm=grad_norm,
                              seconds=time.perf_counter() - t0, skipped=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not all_finite(self.params):  # one fused reduction and one host sync per step
            self._undo_nonfinite_step()
        self.step += 1
        mean = total / share
        self.loss_history.append((self.step, mean))
        return StepReport(step=self.step, loss=mean, lr=lr, grad_norm=grad_norm, seconds=time.perf_counter() - t0)

    def _plan_modulation_ahead(self, steps_left: int) -> None:
        """With streamed blocks, hand the block runner the timesteps of this process's next training forwards
        (at most a modulation window's, within this call's steps) once it has none left: their streamed
        blocks are then copied without the modulation weights (offload.BlockRunner.plan_modulation). The
        timesteps come from copies of the generator and the data order, so training's own draws stay as
        they are: the same values whether planned or not."""
        if self.runner.swapper is None or self.runner.planned_forwards or not self.modulation_window:
            return
        per_step = self.train_cfg.grad_accum_steps
        steps = max(1, min(steps_left, self.modulation_window // per_step))
        rng = torch.Generator()
        rng.set_state(self.rng.get_state())
        order = copy.deepcopy(self.order)
        timesteps = []
        for _ in range(steps):
            for k in range(per_step * self.replicas.size):
                levels = self._draw(order.next(), rng)[3]
                if self.replicas.owns(k):
                    timesteps.append(levels.to(self.device, self.compute_dtype))  # as _flow_loss hands them on
        self.runner.plan_modulation(timesteps)

    def _clip_gradients(self) -> float:
        max_norm = self.optim_cfg.max_grad_norm
        if max_norm > 0:
            return float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        norms = [p.grad.detach().float().norm() for p in self.params if p.grad is not None]
        return float(torch.stack(norms).norm()) if norms else 0.0

    def _micro_batch_loss(self, indices: list[int]) -> torch.Tensor:
        return self._loss_of(self._draw(indices))

    def _draw(self, indices: list[int], rng: torch.Generator | None = None) -> tuple:
        """The micro-batch of these sample indices with its random draws from `rng` (the trainer's generator
        unless given): (samples, x0, noise, levels, dropped)."""
        rng = rng or self.rng
        samples = [self.dataset.samples[i] for i in indices]
        x0 = torch.stack([self.dataset.latents(s.latent_key) for s in samples]).float()  # (B, C, h, w)
        b, _, h, w = x0.shape
        # Random draws, always in this order, from the trainer's CPU generator.
        noise = torch.randn(x0.shape, generator=rng)  # (B, C, h, w)
        grid = (h // PATCH_SIZE, w // PATCH_SIZE)  # image tokens per side
        mu = resolution_mu(grid[0] * grid[1], self.components.scheduler_config) if self.train_cfg.resolution_shift else None
        levels = sample_noise_levels(b, rng, self.train_cfg.timestep_sampling,
                                     self.train_cfg.logit_mean, self.train_cfg.logit_std, mu)  # (B,)
        dropped = torch.rand(b, generator=rng) < self.train_cfg.caption_dropout  # (B,)
        return samples, x0, noise, levels, dropped

    def _loss_of(self, draw: tuple) -> torch.Tensor:
        samples, x0, noise, levels, dropped = draw
        # An edit sample drops to the empty caption seen with its own control images (edit/cache.py).
        empties = [getattr(s, "empty_text_key", "") or self.dataset.prompt_keys[""] for s in samples]
        embeds = [self.dataset.embedding(empty if drop else s.text_key)
                  for s, empty, drop in zip(samples, empties, dropped.tolist())]
        return self._flow_loss(x0, noise, levels, embeds, sample_controls(self.dataset, samples))

    def _flow_loss(self, x0: torch.Tensor, noise: torch.Tensor, levels: torch.Tensor,
                   embeds: list[torch.Tensor], controls: list[list[torch.Tensor]] | None = None) -> torch.Tensor:
        """The flow-matching loss of latents x0 (B, C, h, w) at noise levels (B,) with this noise and these
        prompt embeddings (one per latent). `controls`: per latent its edit control latents, or None."""
        b, _, h, w = x0.shape
        grid = (h // PATCH_SIZE, w // PATCH_SIZE)
        text, text_mask = pad_prompt_batch(embeds)  # (B, L, D), (B, L) or None
        x_t = noisy_latents(x0, noise, levels)
        hidden = pack_latents(x_t).to(self.device, self.compute_dtype)  # (B, N = h/2*w/2, 4C): 2 = PATCH_SIZE
        img_shapes = [[(1, *grid)]] * b
        if controls is not None:  # Qwen-Image-Edit: control tokens after the target's (edit/objective.py)
            hidden, img_shapes = append_controls(hidden, grid, controls)  # (B, N + M, 4C)
        prediction = self.transformer(
            hidden_states=hidden,
            encoder_hidden_states=text.to(self.device, self.compute_dtype),
            encoder_hidden_states_mask=None if text_mask is None else text_mask.to(self.device),
            timestep=levels.to(self.device, self.compute_dtype),
            img_shapes=img_shapes,
            return_dict=False,
        )[0][:, : grid[0] * grid[1]]  # (B, N, 4C): the loss covers the target's tokens only
        target = pack_latents(velocity_target(x0, noise)).to(self.device)
        return flow_loss(prediction, target)

    def validation_loss(self) -> float:
        """Mean flow loss over the held-out samples, each at VALIDATION_LEVELS (shifted by image size like
        training's when resolution_shift is on), with noise drawn from a generator seeded per sample: the
        same LoRA always gives the same value. Nothing of training's state is touched (its generators, data
        order, global RNG; no gradients; LoRA dropout off while it runs)."""
        samples = self.dataset.validation
        if not samples:
            return math.nan
        was_training = self.transformer.training
        self.transformer.eval()
        total = 0.0
        try:
            with torch.no_grad():
                for index, sample in enumerate(samples):
                    x0 = self.dataset.latents(sample.latent_key).float()  # (C, h, w)
                    k = len(VALIDATION_LEVELS)
                    generator = torch.Generator().manual_seed(VALIDATION_SEED + index)
                    noise = torch.randn((k, *x0.shape), generator=generator)  # (K, C, h, w)
                    levels = torch.tensor(VALIDATION_LEVELS, dtype=torch.float32)
                    if self.train_cfg.resolution_shift:
                        tokens = (x0.shape[1] // PATCH_SIZE) * (x0.shape[2] // PATCH_SIZE)
                        levels = time_shift(levels, resolution_mu(tokens, self.components.scheduler_config))
                    embeds = [self.dataset.embedding(sample.text_key)] * k
                    controls = sample_controls(self.dataset, [sample])
                    total += float(self._flow_loss(x0.expand(k, *x0.shape).contiguous(), noise, levels, embeds,
                                                   None if controls is None else controls * k))
        finally:
            self.transformer.train(was_training)
        return total / len(samples)

    def _stop_after_nonfinite(self, count: int) -> None:
        # Every finished step left the LoRA finite (`_one_step` checks), and skipped steps change nothing.
        raise TrainingStopped(
            f"training stopped at step {self.step}: {count} steps in a row had a NaN/inf loss or gradient, so they "
            f"were skipped and the LoRA is unchanged since step {self.step}.{self._lora_file_note()} Try a lower "
            "learning rate, keep max_grad_norm on, train the LoRA in float32, or check the dataset for broken images."
        )

    def _undo_nonfinite_step(self) -> None:
        """The optimizer step just taken made LoRA values NaN/inf: put back the newest checkpoint with finite
        values (LoRA, optimizer state, RNG, data order) and stop; with none, refuse further use. Raises."""
        failed = self.step + 1
        bad = nonfinite_names(dict(zip(self.param_names, self.params)))
        what = (f"training stopped: optimizer step {failed} made {len(bad)} LoRA tensors NaN/inf (first: {bad[:2]})"
                f" although its loss and gradient were finite.{self._lora_file_note()}")
        advice = "Lower the learning rate, keep max_grad_norm on, or train the LoRA in float32."
        notes: list[str] = []
        error = ""
        try:
            restored = self.resume(notes)
        except Exception as e:  # noqa: BLE001 (the run folder changed under us: say so below)
            restored, error = False, f" (reading it failed: {e})"
        if restored:
            lost = (f"; steps {self.step + 1} to {failed} are undone" if self.step + 1 < failed
                    else f"; step {failed} is undone")
            raise TrainingStopped(
                f"{what} The LoRA and its optimizer state were restored from the checkpoint of step {self.step} "
                f"({self.restored_from}), the newest with finite values{lost}. {advice}"
                + (f" ({' '.join(notes)})" if notes else ""))
        where = (f"its run folder {self.run_dir} holds no checkpoint with finite values{error}"
                 if self.run_dir is not None else "this trainer has no run folder, so no checkpoint")
        self.broken_reason = (
            f"{what} It could not be undone: {where}. The LoRA in memory is unusable; nothing was written from it "
            f"and this trainer refuses to train or save. Start the run again (queue again with a lower learning "
            f"rate, or use a new run_name). {advice}")
        raise TrainingStopped(self.broken_reason)

    def _lora_file_note(self) -> str:
        if self.init_lora is None:
            return ""
        return f" This run continued from LoRA file {self.init_lora.path}."

    # ----------------------------------------------------------------------------------------------
    # checkpoints

    def training_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Everything needed to continue bit-exactly: (tensors, JSON-able metadata)."""
        tensors = {f"lora.{n}": p.detach() for n, p in zip(self.param_names, self.params)}
        optim_tensors, optim_rest = ckpt.flatten_state(self.optimizer.state_dict())
        tensors.update(optim_tensors)
        tensors["rng.trainer"] = self.rng.get_state()
        tensors.update({f"rng.global.{k}": v for k, v in self.global_rng_state.items()})
        meta = {
            "step": self.step,
            "order": self.order.state_dict(),
            "loss_history": self.loss_history,
            "validation_history": self.validation_history,
            "optimizer_state": optim_rest,
            "lora": to_dict(self.lora_cfg), "optimizer": to_dict(self.optim_cfg), "train": to_dict(self.train_cfg),
            "base_model": self.components.name, "base_fingerprint": self.base_fingerprint,
            "param_names": self.param_names,
            "num_samples": len(self.dataset.samples),
            "processes": self.replicas.size,
        }
        return tensors, meta

    def save_checkpoint(self) -> Path | None:
        if self.run_dir is None:
            return None
        if self.lock is not None and not self.lock.still_held() and not self.lock.reacquire():
            raise RunFolderLost(
                f"the lock of run folder {self.run_dir} was removed or replaced and another trainer holds it now: the "
                f"checkpoint of step {self.step} was not written, so two trainers never mix their files. The trainer "
                "still holds its steps in memory: save the LoRA now; releasing the run drops the steps since its last "
                "checkpoint."
            )
        tensors, meta = self.training_state()
        if not all_finite(tensors.values()):
            bad = nonfinite_names(tensors)
            raise TrainingStopped(
                f"the checkpoint of step {self.step} was not written: {len(bad)} of its tensors hold NaN or inf "
                f"values (first: {bad[:2]}). The newest checkpoint in {ckpt.checkpoints_dir(self.run_dir)} is "
                "unchanged.")
        if not self.replicas.writes:  # process 0 writes the state, which is the same on every process
            self.saved_step = self.step
            return None
        try:
            folder = ckpt.save_checkpoint(self.run_dir, self.step, tensors, meta)
        except OSError as e:
            raise write_error(e, f"checkpoint of step {self.step}", ckpt.checkpoints_dir(self.run_dir),
                              f"The trainer still holds step {self.step} in memory.") from None
        self.saved_step = self.step
        return folder

    def checkpoint_if_behind(self) -> None:
        if self.broken_reason is not None:  # nothing finite to keep: the last good checkpoint stays the newest
            return
        if self.run_dir is not None and self.saved_step != self.step:
            self.save_checkpoint()

    def resume(self, notes: list[str] | None = None) -> bool:
        """Continue from the newest usable checkpoint in `run_dir` (complete, finite values); False when
        there is none. A sentence per checkpoint passed over goes to `notes` (default: `resume_notes`)."""
        if self.run_dir is None:
            return False
        notes = self.resume_notes if notes is None else notes
        loaded = ckpt.load_latest(self.run_dir, notes=notes)
        if loaded is None:
            return False
        tensors, meta, folder = loaded
        self._check_compatible(meta, folder)
        note = world_size_note(meta, self.replicas.size, self.train_cfg.grad_accum_steps)
        if note is not None:
            notes.append(note)
        with torch.no_grad():
            for name, p in zip(self.param_names, self.params):
                p.copy_(tensors[f"lora.{name}"])
        self.optimizer.load_state_dict(ckpt.unflatten_state(tensors, meta["optimizer_state"]))
        self.rng.set_state(tensors["rng.trainer"])
        self.global_rng_state = {k.removeprefix("rng.global."): v for k, v in tensors.items()
                                 if k.startswith("rng.global.")}
        saved_train = from_dict(TrainConfig, meta["train"])
        if (len(self.dataset.samples) == meta["num_samples"]
                and saved_train.micro_batch_size == self.train_cfg.micro_batch_size
                and saved_train.seed == self.train_cfg.seed):
            self.order.load_state_dict(meta["order"])
        self.step = meta["step"]
        self.saved_step = self.step
        self.restored_from = folder
        self.broken_reason = None
        self.loss_history = [tuple(x) for x in meta["loss_history"]]
        self.validation_history = [tuple(x) for x in meta.get("validation_history", [])]  # older checkpoints: none
        self.step_previews = [p for p in self.step_previews if p.step <= self.step]  # none of undone steps
        return True

    def _check_compatible(self, meta: dict, folder: Path) -> None:
        saved_lora = meta["lora"]
        differences = [
            f"{key}: checkpoint {saved_lora[key]!r}, now {getattr(self.lora_cfg, key)!r}"
            for key in MUST_MATCH_LORA if saved_lora[key] != getattr(self.lora_cfg, key)
        ]
        if meta["optimizer"]["optimizer"] != self.optim_cfg.optimizer:
            differences.append(f"optimizer: checkpoint {meta['optimizer']['optimizer']!r}, "
                               f"now {self.optim_cfg.optimizer!r}")
        if meta["base_fingerprint"] not in self.accepted_base_fingerprints:
            differences.append(f"base model: checkpoint {meta['base_model']!r}, now {self.components.name!r} "
                               "(different weights)")
        elif meta["param_names"] != self.param_names:
            differences.append("LoRA layers differ (another model size or target set)")
        if differences:
            raise UserInputError(
                f"run '{self.train_cfg.run_name}' has a checkpoint at step {meta['step']} ({folder}) that does not "
                f"match these settings: {'; '.join(differences)}. Change them back to continue that run, or use a "
                "new run_name to start another."
            )

    # ----------------------------------------------------------------------------------------------
    # outputs

    def lora_state_dict(self, dtype: torch.dtype = torch.bfloat16, layout: str = "comfyui") -> dict[str, torch.Tensor]:
        self.require_live()
        if self.broken_reason is not None:
            raise TrainingStopped(self.broken_reason)
        return lora_file_tensors(self.transformer, self.lora_cfg.rank, self.lora_cfg.alpha, dtype, layout)

    def lora_metadata(self, layout: str = "comfyui") -> dict[str, str]:
        """Rank, alpha, targets, steps (all the weights have seen, a continued file's included), base model."""
        init_steps = (self.init_lora.steps or 0) if self.init_lora is not None else 0
        extra = {"qwen_lora.run_name": self.train_cfg.run_name, "qwen_lora.base_fingerprint": self.base_fingerprint,
                 "qwen_lora.run_steps": str(self.step)}
        if self.init_lora is not None:
            extra["qwen_lora.init_lora"] = self.init_lora.path.name
            extra["qwen_lora.init_lora_steps"] = str(self.init_lora.steps) if self.init_lora.steps is not None else "unknown"
        if set(self.lora_modules) != set(target_module_names(self.transformer, self.lora_cfg.targets)):
            extra["qwen_lora.targets"] = "custom"
            extra["qwen_lora.modules"] = json.dumps(self.lora_modules)
        extra.update(layout_metadata(layout, self.lora_cfg.rank, self.lora_cfg.alpha))
        return lora_metadata(self.lora_cfg, init_steps + self.step, self.components.name, extra)

    def sample_preview(self, prompt: str, negative_prompt: str = "", width: int = 1024, height: int = 1024,
                       steps: int = 20, cfg_scale: float = 4.0, seed: int = 0,
                       progress: Callable[[int, int], None] | None = None,
                       control_images: list[Image.Image] | None = None) -> Image.Image:
        """An image from the adapter as it is now (`sampling.sample_image`; the prompts must be cached). An edit
        model edits `control_images`, or else a training sample's controls (edit/sampling.py)."""
        self.require_live()
        if self.components.edit is not None:  # Qwen-Image-Edit
            from .edit.sampling import sample_edit_image

            return sample_edit_image(self.components, self.dataset, prompt, negative_prompt, width, height, steps,
                                     cfg_scale, seed, progress=progress, control_images=control_images)
        return sample_image(self.components, self.dataset, prompt, negative_prompt, width, height, steps, cfg_scale,
                            seed, progress=progress)

    def save_lora(self, path, dtype: torch.dtype = torch.bfloat16, layout: str = "comfyui") -> Path:
        """Write the adapter in `layout` (lora_files.LORA_LAYOUTS; default ComfyUI's), atomically; return the path."""
        remove_leftovers(Path(path).parent, names=r".+\.safetensors")  # of killed saves (theirs, never a user's)
        try:
            return write_safetensors_atomic(self.lora_state_dict(dtype, layout), path, self.lora_metadata(layout))
        except OSError as e:
            raise write_error(e, "LoRA file", Path(path),
                              f"Any earlier {Path(path).name} is intact and the trainer still holds step "
                              f"{self.step}.") from None

    # ----------------------------------------------------------------------------------------------
    # lifetime

    @property
    def live(self) -> bool:
        return self.retired_reason is None

    def require_live(self) -> None:
        """Raise the reason this trainer was retired (another run took its model, or it was released)."""
        if self.retired_reason is not None:
            raise UserInputError(self.retired_reason)

    def retire(self, reason: str, unpin: bool = False) -> None:
        """Checkpoint, give the model back (`close`), let go of the model set and the dataset, and refuse any
        further use with `reason`. The loss history stays (a loss plot still works)."""
        if self.retired_reason is not None:
            return
        if self.params:
            try:
                self.checkpoint_if_behind()  # if this fails (a full disk) nothing is retired: no step is lost
            except RunFolderLost:
                pass  # another trainer owns the folder now: writing there would mix two runs' checkpoints
        self.retired_reason = reason
        self.close(unpin=unpin)
        self.components = self.transformer = self.dataset = None

    def close(self, unpin: bool = False) -> None:
        """Give the transformer back as it was (no adapter, blocks' own forward), drop every tensor this
        trainer owns (adapter, gradients, optimizer state, swap slots) and unlock the run folder.

        The model set can then be trained again by a new Trainer. `unpin`: also move the swapped blocks'
        master weights out of pinned memory (when the model set is released rather than handed on).
        """
        if self.components is None:  # retired: closed already
            return
        if self.runner is not None:
            self.runner.uninstall(unpin=unpin)
        owner = self.components.trainer_ref() if self.components.trainer_ref is not None else None
        if owner is self:  # never take out an adapter that another trainer owns
            if self.transformer is not None:
                remove_lora(self.transformer)
            self.components.trainer_ref = None
        if self.optimizer is not None:
            self.optimizer.state.clear()
            self.optimizer.param_groups.clear()
        self.params, self.runner, self.optimizer = [], None, None
        if self.lock is not None:
            self.lock.release()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def last_loss(self) -> float:
        return self.loss_history[-1][1] if self.loss_history else math.nan


def micro_batch_seed(seed: int, step: int, k: int) -> int:
    """The global RNG's seed for micro-batch `k` of optimizer step `step` (0-based) of a run seeded `seed`."""
    digest = hashlib.sha256(f"{seed}/{step}/{k}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # torch.manual_seed takes up to 2**63 - 1


def _seed_global_rng(seed: int, device: torch.device) -> None:
    """Seed torch's global RNG on the CPU and on `device` (only there: another GPU of the machine is another
    process's)."""
    torch.random.default_generator.manual_seed(seed)
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.manual_seed(seed)


def _global_rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_global_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _seeded_global_rng_state(seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return _global_rng_state(device)
