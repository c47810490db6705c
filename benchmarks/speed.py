"""Step time of our Trainer against a bare diffusers + peft loop doing the same work, and the cost of
training in chunks. Used by `memory_cpu.py`; runnable alone: `python benchmarks/speed.py`.

Same work on both sides: the same random transformer (config, weights), the same LoRA targets and rank,
bitsandbytes AdamW8bit with the same hyper-parameters, gradient clipping at 1.0, batch 1 from the same
cached latents and prompt embeddings, a logit-normal noise level with Qwen's resolution shift, MSE in
fp32, and the loss read back every step. The bare loop uses diffusers' stock `nn.Linear`s and peft's
LoRA as they come; ours goes through `Trainer.train` (data order, its own RNG streams, schedule, loss
history, `FrozenLinearFunction`). This machine is a shared VM whose speed
drifts by +-10% within a minute, so runs are short and paired: ours and bare alternate (ours, bare, bare,
ours, ...) a few steps at a time, each ratio is taken within a back-to-back pair, and the median of the
pair ratios is reported (with the ratio of the fastest runs as a second, interference-free estimate).
Two instances of one and the same setup (same weights) also differ by a few percent on this CPU (memory
placement of the weights; measured: five variants, identical code for some, spread 0.97..1.00), so each
side is built `instances` times and the pairs cycle through them.
Chunking is measured the same way (one call of n steps against k calls of n/k, alternating), and also
directly: the fixed cost of one `Trainer.train` call is timed with `train(0)`, which bounds the chunking
ratio as 1 + (k - 1) x call cost / (n x step time).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

from common import synthetic_setup

import torch

from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.devtools.random_weights import random_transformer
from trainer_core.adapters.lora import target_module_names
from trainer_core.training.objective import resolution_mu
from trainer_core.training import Trainer

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
    ratio_of_fastest: float  # fastest ours / fastest bare
    chunked_s: float  # median seconds for n steps as k chunks
    whole_s: float  # median seconds for n steps in one call
    chunk_ratio: float  # median over pairs of chunked / whole
    call_overhead_s: float  # median seconds of `train(0)`: the fixed cost of one train call
    chunk_ratio_bound: float  # 1 + (k - 1) x call overhead / (n x ours_step_s)
    steps: int
    chunks: int
    repeats: int
    latent_hw: tuple[int, int]
    ratios: list[float]
    chunk_ratios: list[float]


SMOKE_MODEL = dict(num_layers=1, num_attention_heads=1, joint_attention_dim=64)  # D = 128: a smoke run's


def _model(config: dict):
    # float32 storage: on a CPU float8 is mostly cast cost (DESIGN §9); this measures the loop, not casts.
    return random_transformer(config, storage="float32", compute_dtype=torch.float32, seed=0)


def our_trainer(seed: int = 0, checkpointing: bool = False, latent_hw: tuple[int, int] = LATENT_HW,
                config: dict = MODEL) -> Trainer:
    model = _model(config)
    components, dataset = synthetic_setup(model, samples=8, latent_hw=latent_hw, text_tokens=TEXT_TOKENS,
                                          device=torch.device("cpu"), compute_dtype=torch.float32, storage="float32")
    return Trainer(components, dataset, LoraConfig(rank=RANK, alpha=float(RANK), targets=TARGETS),
                   OptimizerConfig(optimizer="adamw8bit", learning_rate=1e-4),
                   TrainConfig(seed=seed, micro_batch_size=1, gradient_checkpointing=checkpointing,
                               resolution_shift=True))


class BareLoop:
    """What a user would write with diffusers + peft + bitsandbytes and nothing of ours."""

    def __init__(self, seed: int = 0, checkpointing: bool = False, latent_hw: tuple[int, int] = LATENT_HW,
                 config: dict = MODEL):
        import bitsandbytes as bnb
        from peft import LoraConfig as PeftLoraConfig
        from peft import inject_adapter_in_model

        model = _model(config)
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


def _timed(run, n: int) -> float:
    t = time.perf_counter()
    run(n)
    return time.perf_counter() - t


def measure(pairs: int = 30, steps: int = 2, chunk_pairs: int = 16, chunk_steps: int = 8, chunks: int = 4,
            instances: int = 3, checkpointing: bool = False, latent_hw: tuple[int, int] = LATENT_HW,
            log=print, warmup: int = 3, config: dict = MODEL) -> SpeedResult:
    """Paired, alternating runs over several instances (see module docstring); `steps` per timed run."""
    ours = [our_trainer(checkpointing=checkpointing, latent_hw=latent_hw, config=config) for _ in range(instances)]
    bare = [BareLoop(checkpointing=checkpointing, latent_hw=latent_hw, config=config) for _ in range(instances)]
    for side in ours + bare:
        side.train(warmup)
    ours_t, bare_t = [], []
    for r in range(pairs):
        o, b = ours[r % instances], bare[r % instances]
        sides = [(o.train, ours_t), (b.train, bare_t)][:: 1 if (r // instances) % 2 == 0 else -1]
        for run, into in sides:
            into.append(_timed(run, steps) / steps)
    ratios = [o / b for o, b in zip(ours_t, bare_t)]
    log(f"  step time, {pairs} pairs of {steps} steps over {instances} instances each: ours median "
        f"{statistics.median(ours_t) * 1e3:.1f} ms, bare median {statistics.median(bare_t) * 1e3:.1f} ms; pair ratios: "
        + " ".join(f"{x:.3f}" for x in ratios))

    # Chunking: two trainers swap roles (one call of n steps / k calls of n/k) from pair to pair.
    first, second = ours[0], ours[1 % instances] if instances > 1 else our_trainer(latent_hw=latent_hw, config=config)
    whole_t, chunked_t = [], []
    for r in range(chunk_pairs):
        whole, chunked = (first, second) if r % 2 == 0 else (second, first)
        order = ["whole", "chunked"][:: 1 if (r // 2) % 2 == 0 else -1]
        for kind in order:
            if kind == "whole":
                whole_t.append(_timed(whole.train, chunk_steps))
            else:
                t = time.perf_counter()
                for _ in range(chunks):
                    chunked.train(chunk_steps // chunks)
                chunked_t.append(time.perf_counter() - t)
    chunk_ratios = [c / w for c, w in zip(chunked_t, whole_t)]
    overhead = statistics.median(_timed(first.train, 0) for _ in range(50))
    o = statistics.median(ours_t)
    bound = 1 + (chunks - 1) * overhead / (chunk_steps * o)
    log(f"  chunking, {chunk_pairs} pairs: {chunk_steps} steps in one call median {statistics.median(whole_t):.3f} s, "
        f"in {chunks} calls {statistics.median(chunked_t):.3f} s; pair ratios: "
        + " ".join(f"{x:.3f}" for x in chunk_ratios))
    log(f"  one train() call's fixed cost (train(0), median of 50): {overhead * 1e6:.0f} us")
    return SpeedResult(ours_step_s=o, bare_step_s=statistics.median(bare_t), ratio=statistics.median(ratios),
                       ratio_of_fastest=min(ours_t) / min(bare_t), chunked_s=statistics.median(chunked_t),
                       whole_s=statistics.median(whole_t), chunk_ratio=statistics.median(chunk_ratios),
                       call_overhead_s=overhead, chunk_ratio_bound=bound, steps=chunk_steps, chunks=chunks,
                       repeats=pairs, latent_hw=latent_hw, ratios=ratios, chunk_ratios=chunk_ratios)


def forward_backward_ab(rounds: int = 12, calls: int = 6, instances: int = 2,
                        latent_hw: tuple[int, int] = LATENT_HW, config: dict = MODEL) -> dict[str, float]:
    """Median ms of one forward + backward (no optimizer, no data) of three setups with the same weights:
    our trainer's model (FrozenLinearFunction + BlockRunner), the same with diffusers' stock Linear forward
    put back, and the bare diffusers + peft model; `instances` of each, rotating order. Attributes a
    step-time difference to the model's compute path or to the training loop around it."""
    setups: dict[str, list] = {"ours": [], "ours, stock Linear": [], "bare": []}
    for _ in range(instances):
        setups["ours"].append(our_trainer(latent_hw=latent_hw, config=config).built.transformer)
        stock = our_trainer(latent_hw=latent_hw, config=config).built.transformer
        for m in stock.transformer_blocks.modules():
            if isinstance(m, torch.nn.Linear) and "forward" in m.__dict__:
                del m.forward
        setups["ours, stock Linear"].append(stock)
        setups["bare"].append(BareLoop(latent_hw=latent_hw, config=config).model)
    g = torch.Generator().manual_seed(0)
    h, w = latent_hw[0] // 2, latent_hw[1] // 2
    x = torch.randn(1, h * w, 64, generator=g)  # (B, packed tokens, 4 x 16 channels)
    text = torch.randn(1, TEXT_TOKENS, setups["bare"][0].config.joint_attention_dim, generator=g)  # (B, text, joint)

    def step(model):
        out = model(hidden_states=x, encoder_hidden_states=text, timestep=torch.tensor([0.5]),
                    img_shapes=[[(1, h, w)]], return_dict=False)[0]
        out.square().mean().backward()

    times = {k: [] for k in setups}
    names = list(setups)
    for models in setups.values():
        for m in models:
            m.train()
            step(m)
    for r in range(rounds):
        for name in names[r % 3:] + names[: r % 3]:
            model = setups[name][r % instances]
            t = time.perf_counter()
            for _ in range(calls):
                step(model)
            times[name].append((time.perf_counter() - t) / calls * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def profile_ours(steps: int = 10, top: int = 25, warmup: int = 3, config: dict = MODEL) -> str:
    """cProfile of our trainer's steps (cumulative time), as text."""
    import cProfile
    import io
    import pstats

    trainer = our_trainer(config=config)
    trainer.train(warmup)
    prof = cProfile.Profile()
    prof.enable()
    trainer.train(steps)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


SMOKE = dict(pairs=2, steps=1, chunk_pairs=2, chunk_steps=2, chunks=2, instances=1, warmup=1, config=SMOKE_MODEL,
             latent_hw=(8, 8))  # seconds: that it runs


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a run of seconds (benchmarks/smoke.py): the figures "
                        "mean nothing, only that every part runs")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(measure(**SMOKE) if args.smoke else measure())
    if args.smoke:
        print(forward_backward_ab(rounds=1, calls=1, instances=1, latent_hw=(8, 8), config=SMOKE_MODEL))
        print(profile_ours(steps=1, top=3, warmup=1, config=SMOKE_MODEL))
