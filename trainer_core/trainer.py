"""The Trainer: owns the model with its adapter, the optimizer, the schedule, the RNG and the data order.

Training is step-chunked: `train(n)` runs n more optimizer steps and returns a report. Nothing is
re-seeded or rebuilt between calls, so k chunks give bit-identical weights to one call of the same
total length. Every random draw (noise, noise level, caption dropout) comes from one CPU generator
owned by the trainer, in a fixed order, so results do not depend on the device's RNG either.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .batching import DataOrder
from .cache import CachedDataset
from .config import LoraConfig, OptimizerConfig, TrainConfig
from .files import write_safetensors_atomic
from .lora import inject_lora, lora_metadata, matching_preset, remove_lora, target_module_names
from .lora_files import LoraFile, check_targets, layout_metadata, load_into_adapter, lora_file_tensors, read_lora_file
from .models.components import QwenImageComponents
from .models.latents import pack_latents
from .models.text import pad_prompt_batch
from .objective import flow_loss, noisy_latents, resolution_mu, sample_noise_levels, velocity_target
from .offload import BlockRunner
from .optim import build_optimizer, build_schedule


@dataclass
class StepReport:
    step: int  # 1-based number of the optimizer step just finished
    loss: float  # mean over the step's micro-batches
    lr: float
    grad_norm: float
    seconds: float


@dataclass
class TrainReport:
    first_step: int
    last_step: int
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step + 1 if self.losses else 0

    @property
    def mean_loss(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else float("nan")


class Trainer:
    def __init__(
        self,
        components: QwenImageComponents,
        dataset: CachedDataset,
        lora: LoraConfig,
        optimizer: OptimizerConfig,
        train: TrainConfig,
        init_lora: str | Path | None = None,
    ):
        """`init_lora`: continue from this LoRA file (any layout `lora_files.read_lora_file` reads). The file
        decides rank, alpha and the adapted modules (it holds the weights for exactly those; anything else
        would drop part of it or start part of it from scratch); dropout and dtype come from `lora`. The
        optimizer, schedule and step count start fresh: a LoRA file carries no optimizer state."""
        lora.validate()
        optimizer.validate()
        train.validate(num_blocks=components.num_blocks)
        if not dataset.samples:
            raise ValueError("the cached dataset has no samples")
        self.components = components
        self.dataset = dataset
        self.lora_cfg, self.optim_cfg, self.train_cfg = lora, optimizer, train
        self.device = components.device
        self.compute_dtype = components.compute_dtype
        self.transformer = components.transformer
        self.base_fingerprint = components.fingerprint("transformer")  # before the adapter joins the model
        self.init_lora: LoraFile | None = None
        modules = None
        if init_lora is not None:
            self.init_lora = read_lora_file(init_lora)
            check_targets(self.transformer, self.init_lora)
            modules = self.init_lora.targets
            self.lora_cfg = lora = dataclasses.replace(
                lora, rank=self.init_lora.rank, alpha=self.init_lora.alpha,
                targets=matching_preset(self.transformer, modules) or lora.targets)
        self.lora_modules = modules or target_module_names(self.transformer, lora.targets)
        self.params = inject_lora(self.transformer, lora, seed=train.seed, modules=self.lora_modules)
        if self.init_lora is not None:
            load_into_adapter(self.transformer, self.init_lora.weights)
        self.runner = BlockRunner(self.transformer, self.device, blocks_to_swap=train.blocks_to_swap,
                                  checkpointing=train.gradient_checkpointing)
        self.optimizer = build_optimizer(self.params, optimizer)
        self.schedule = build_schedule(self.optimizer, optimizer)
        self.rng = torch.Generator().manual_seed(train.seed)
        # LoRA dropout draws from torch's global RNG (of the device it runs on). The trainer keeps its own
        # copy of that state and installs it only while it trains, so other nodes' random draws never
        # change training and chunked training equals one long run.
        self.global_rng_state = _seeded_global_rng_state(train.seed, self.device)
        self.order = DataOrder([s.bucket for s in dataset.samples], repeats=dataset.repeats,
                               batch_size=train.micro_batch_size, seed=train.seed)
        self.step = 0
        self.loss_history: list[tuple[int, float]] = []

    # ----------------------------------------------------------------------------------------------
    # training

    def train(self, n_steps: int, on_step: Callable[[StepReport], None] | None = None) -> TrainReport:
        """Run `n_steps` more optimizer steps. `on_step` runs after each finished step (it may raise to
        stop training at that step boundary; the trainer stays consistent and usable)."""
        report = TrainReport(first_step=self.step + 1, last_step=self.step)
        started = time.perf_counter()
        self.transformer.train()
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            _set_global_rng_state(self.global_rng_state, self.device)
            try:
                for _ in range(n_steps):
                    step_report = self._one_step()
                    self.global_rng_state = _global_rng_state(self.device)
                    report.losses.append(step_report.loss)
                    report.last_step = self.step
                    if on_step is not None:
                        on_step(step_report)
            finally:
                self.transformer.eval()
                report.seconds = time.perf_counter() - started
        return report

    def _one_step(self) -> StepReport:
        t0 = time.perf_counter()
        accum = self.train_cfg.grad_accum_steps
        total = 0.0
        for _ in range(accum):
            loss = self._micro_batch_loss(self.order.next())
            (loss / accum).backward()
            total += loss.item()
        grad_norm = self._clip_gradients()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        mean = total / accum
        self.loss_history.append((self.step, mean))
        return StepReport(step=self.step, loss=mean, lr=lr, grad_norm=grad_norm, seconds=time.perf_counter() - t0)

    def _clip_gradients(self) -> float:
        max_norm = self.optim_cfg.max_grad_norm
        if max_norm > 0:
            return float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        norms = [p.grad.detach().float().norm() for p in self.params if p.grad is not None]
        return float(torch.stack(norms).norm()) if norms else 0.0

    def _micro_batch_loss(self, indices: list[int]) -> torch.Tensor:
        samples = [self.dataset.samples[i] for i in indices]
        x0 = torch.stack([self.dataset.latents(s.latent_key) for s in samples]).float()  # (B, C, h, w)
        b, _, h, w = x0.shape
        # Random draws, always in this order, from the trainer's CPU generator.
        noise = torch.randn(x0.shape, generator=self.rng)  # (B, C, h, w)
        mu = resolution_mu((h // 2) * (w // 2), self.components.scheduler_config) if self.train_cfg.resolution_shift else None
        levels = sample_noise_levels(b, self.rng, self.train_cfg.timestep_sampling,
                                     self.train_cfg.logit_mean, self.train_cfg.logit_std, mu)  # (B,)
        dropped = torch.rand(b, generator=self.rng) < self.train_cfg.caption_dropout  # (B,)

        empty = self.dataset.prompt_keys[""]
        embeds = [self.dataset.embedding(empty if drop else s.text_key) for s, drop in zip(samples, dropped.tolist())]
        text, text_mask = pad_prompt_batch(embeds)  # (B, L, D), (B, L) or None

        x_t = noisy_latents(x0, noise, levels)
        prediction = self.transformer(
            hidden_states=pack_latents(x_t).to(self.device, self.compute_dtype),  # (B, h/2*w/2, 4C)
            encoder_hidden_states=text.to(self.device, self.compute_dtype),
            encoder_hidden_states_mask=None if text_mask is None else text_mask.to(self.device),
            timestep=levels.to(self.device, self.compute_dtype),
            img_shapes=[[(1, h // 2, w // 2)]] * b,
            return_dict=False,
        )[0]  # (B, h/2*w/2, 4C)
        target = pack_latents(velocity_target(x0, noise)).to(self.device)
        return flow_loss(prediction, target)

    # ----------------------------------------------------------------------------------------------
    # outputs

    def lora_state_dict(self, dtype: torch.dtype = torch.bfloat16, layout: str = "comfyui") -> dict[str, torch.Tensor]:
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

    def save_lora(self, path, dtype: torch.dtype = torch.bfloat16, layout: str = "comfyui"):
        """Write the adapter in `layout` (lora_files.LORA_LAYOUTS; default ComfyUI's), atomically; return the path."""
        return write_safetensors_atomic(self.lora_state_dict(dtype, layout), path, self.lora_metadata(layout))

    def close(self) -> None:
        """Give the transformer back as it was (no adapter, blocks' own forward) and free optimizer state.

        The model set can then be trained again by a new Trainer.
        """
        self.runner.uninstall()
        remove_lora(self.transformer)
        self.optimizer.state.clear()
        self.params = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def last_loss(self) -> float:
        return self.loss_history[-1][1] if self.loss_history else math.nan


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
