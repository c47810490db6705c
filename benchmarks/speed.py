"""Step time of our Trainer against a bare diffusers + peft loop doing the same work, and the cost of
training in chunks. Used by `memory_cpu.py`; runnable alone: `python benchmarks/speed.py`.

Same work on both sides: the same random transformer (config, weights), the same LoRA targets and rank,
bitsandbytes AdamW8bit with the same hyper-parameters, gradient clipping at 1.0, batch 1 from the same
cached latents and prompt embeddings, a logit-normal noise level with Qwen's resolution shift, MSE in
fp32, and the loss read back every step. The bare loop uses diffusers' stock `nn.Linear`s and peft's
LoRA as they come; ours goes through `Trainer.train` (data order, its own RNG streams, schedule, loss
history, `FrozenLinearFunction`). Runs alternate (ours, bare, bare, ours, ...) and each ratio is taken
within a back-to-back pair, so slow drifts of a shared machine cancel; reported: the median of the pair
ratios, and the medians of the times themselves. Each run's first steps are not timed.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

from common import synthetic_setup

import torch

from trainer_core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.lora import target_module_names
from trainer_core.models.random import random_transformer
from trainer_core.objective import resolution_mu
from trainer_core.trainer import Trainer

MODEL = dict(num_layers=2, num_attention_heads=4)  # D = 512, F = 2048: ~9M parameters per block
LATENT_HW = (32, 32)  # a 256 x 256 image: 16 x 16 = 256 packed tokens
TEXT_TOKENS = 32
RANK = 16
TARGETS = "attention+mlp"


@dataclass
class SpeedResult:
    ours_step_s: float  # median seconds per step
    bare_step_s: float
    ratio: float  # median over pairs of ours / bare
    chunked_s: float  # median seconds for n steps as k chunks
    whole_s: float  # median seconds for n steps in one call
    chunk_ratio: float  # median over pairs of chunked / whole
    steps: int
    chunks: int
    repeats: int
    latent_hw: tuple[int, int]
    ratios: list[float]
    chunk_ratios: list[float]


def _model():
    # float32 storage: on a CPU float8 is mostly cast cost (DESIGN §9); this measures the loop, not casts.
    return random_transformer(MODEL, storage="float32", compute_dtype=torch.float32, seed=0)


def our_trainer(seed: int = 0, checkpointing: bool = False, latent_hw: tuple[int, int] = LATENT_HW) -> Trainer:
    model = _model()
    components, dataset = synthetic_setup(model, samples=8, latent_hw=latent_hw, text_tokens=TEXT_TOKENS,
                                          device=torch.device("cpu"), compute_dtype=torch.float32, storage="float32")
    return Trainer(components, dataset, LoraConfig(rank=RANK, alpha=float(RANK), targets=TARGETS),
                   OptimizerConfig(optimizer="adamw8bit", learning_rate=1e-4),
                   TrainConfig(seed=seed, micro_batch_size=1, gradient_checkpointing=checkpointing,
                               resolution_shift=True))


class BareLoop:
    """What a user would write with diffusers + peft + bitsandbytes and nothing of ours."""

    def __init__(self, seed: int = 0, checkpointing: bool = False, latent_hw: tuple[int, int] = LATENT_HW):
        import bitsandbytes as bnb
        from peft import LoraConfig as PeftLoraConfig
        from peft import inject_adapter_in_model

        model = _model()
        for m in model.transformer_blocks.modules():  # back to diffusers' stock nn.Linear.forward
            if isinstance(m, torch.nn.Linear) and "forward" in m.__dict__:
                del m.forward
        names = target_module_names(model, TARGETS)
        inject_adapter_in_model(PeftLoraConfig(r=RANK, lora_alpha=RANK, target_modules=names), model)
        if checkpointing:
            model.enable_gradient_checkpointing()
        self.model = model.train()
        self.params = [p for n, p in model.named_parameters() if "lora_" in n]
        for n, p in model.named_parameters():
            p.requires_grad_("lora_" in n)
        self.opt = bnb.optim.AdamW8bit(self.params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        _, dataset = synthetic_setup(model, samples=8, latent_hw=latent_hw, text_tokens=TEXT_TOKENS,
                                     device=torch.device("cpu"), compute_dtype=torch.float32)
        self.latents = [dataset.latents(s.latent_key) for s in dataset.samples]
        self.texts = [dataset.embedding(s.text_key) for s in dataset.samples]
        self.g = torch.Generator().manual_seed(seed)
        self.mu = resolution_mu((latent_hw[0] // 2) * (latent_hw[1] // 2), _scheduler())
        self.i = 0

    def train(self, n: int) -> list[float]:
        losses = []
        for _ in range(n):
            k = self.i % len(self.latents)
            self.i += 1
            x0 = self.latents[k][None]  # (1, C, h, w)
            b, c, h, w = x0.shape
            noise = torch.randn(x0.shape, generator=self.g)
            s = torch.sigmoid(torch.randn(b, generator=self.g)).clamp(1e-5, 1 - 1e-5)
            s = math.exp(self.mu) / (math.exp(self.mu) + (1 / s - 1))
            x_t = (1 - s.view(-1, 1, 1, 1)) * x0 + s.view(-1, 1, 1, 1) * noise
            pack = lambda t: t.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * 4)  # noqa: E731
            pred = self.model(hidden_states=pack(x_t), encoder_hidden_states=self.texts[k][None], timestep=s,
                              img_shapes=[[(1, h // 2, w // 2)]], return_dict=False)[0]
            loss = torch.nn.functional.mse_loss(pred.float(), pack(noise - x0).float())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return losses


def _scheduler():
    from trainer_core.models.scheduler import QWEN_IMAGE_SCHEDULER_CONFIG

    return dict(QWEN_IMAGE_SCHEDULER_CONFIG)


def _seconds_per_step(run, n: int, warmup: int) -> float:
    """Mean seconds per step of one call that trains `n` steps, after `warmup` untimed steps."""
    run(warmup)
    t = time.perf_counter()
    run(n)
    return (time.perf_counter() - t) / n


def measure(repeats: int = 9, steps: int = 12, chunks: int = 4, warmup: int = 2, checkpointing: bool = False,
            latent_hw: tuple[int, int] = LATENT_HW, log=print) -> SpeedResult:
    """Paired, alternating runs (see module docstring)."""
    ours = our_trainer(checkpointing=checkpointing, latent_hw=latent_hw)
    bare = BareLoop(checkpointing=checkpointing, latent_hw=latent_hw)
    ours_t, bare_t = [], []
    for r in range(repeats):
        pairs = [(ours.train, ours_t), (bare.train, bare_t)][:: 1 if r % 2 == 0 else -1]
        for run, into in pairs:
            into.append(_seconds_per_step(run, steps, warmup))
        log(f"  pair {r + 1}/{repeats}: ours {ours_t[-1] * 1e3:.1f} ms/step, bare {bare_t[-1] * 1e3:.1f} ms/step, "
            f"ratio {ours_t[-1] / bare_t[-1]:.3f}")

    # Chunking: one call of n steps against k calls of n/k steps, two trainers, alternating.
    whole = our_trainer(checkpointing=checkpointing, latent_hw=latent_hw)
    chunked = our_trainer(checkpointing=checkpointing, latent_hw=latent_hw)
    whole.train(warmup)
    chunked.train(warmup)
    whole_t, chunked_t = [], []
    for r in range(repeats):
        order = [("whole", whole), ("chunked", chunked)][:: 1 if r % 2 == 0 else -1]
        for kind, trainer in order:
            t = time.perf_counter()
            if kind == "whole":
                trainer.train(steps)
                whole_t.append(time.perf_counter() - t)
            else:
                for _ in range(chunks):
                    trainer.train(steps // chunks)
                chunked_t.append(time.perf_counter() - t)
        log(f"  pair {r + 1}/{repeats}: {steps} steps in one call {whole_t[-1]:.3f} s, in {chunks} calls "
            f"{chunked_t[-1]:.3f} s, ratio {chunked_t[-1] / whole_t[-1]:.3f}")
    ratios = [o / b for o, b in zip(ours_t, bare_t)]
    chunk_ratios = [c / w for c, w in zip(chunked_t, whole_t)]
    return SpeedResult(ours_step_s=statistics.median(ours_t), bare_step_s=statistics.median(bare_t),
                       ratio=statistics.median(ratios), chunked_s=statistics.median(chunked_t),
                       whole_s=statistics.median(whole_t), chunk_ratio=statistics.median(chunk_ratios),
                       steps=steps, chunks=chunks, repeats=repeats, latent_hw=latent_hw, ratios=ratios,
                       chunk_ratios=chunk_ratios)


def profile_ours(steps: int = 10, top: int = 25) -> str:
    """cProfile of our trainer's steps (cumulative time), as text."""
    import cProfile
    import io
    import pstats

    trainer = our_trainer()
    trainer.train(3)
    prof = cProfile.Profile()
    prof.enable()
    trainer.train(steps)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


if __name__ == "__main__":
    torch.manual_seed(0)
    print(measure())
