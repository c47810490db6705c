"""GPU check of the timeline model and the float8 compute paths: seconds per step measured against predicted,
real-size Qwen-Image built in memory with random float8 weights (`gpu_check.py` checks memory phase by phase).

    python benchmarks/gpu_speed_check.py [--out DIR]   # CUDA (part of benchmarks/device_check.sh)
    python benchmarks/gpu_speed_check.py --tiny        # CPU, tiny dims, the same code path

The real transformer (60 blocks, 20.4B parameters) is built directly on the GPU, one tensor at a time
(`devtools.random_weights.random_transformer`: no file, no download), with a synthetic in-memory dataset
(1024 x 1024: 4096 packed latent tokens; 256 prompt tokens). Each configuration is a fresh `Trainer` (rank 32
attention+mlp, fp32 LoRA, AdamW8bit, checkpointing) trained --steps steps, in this order, as the time slice
allows: the planner's choice for 24 GiB and for 16 GiB and all resident (the eager float8 path: each matmul
copies its weight to bf16), then at all resident the other float8 paths, fp8 activations
(`TrainConfig.fp8_activations`) and the compiled one (`TrainConfig.compile_float8`, CUDA with Triton only), each
with its losses against the eager row's (same batches), then the comparisons at the 16 GiB choice
(`comparison.Comparison`: the streamed blocks as the tail, peft's fp32 LoRA compute, no modulation ahead), then the
blocks as ComfyUI's int8 ConvRot file holds them, and int8 compute (`TrainConfig.int8_compute`) on them all resident
and at the 24 and 16 GiB choices.

Per configuration: max allocated / reserved over the steps, the planner's prediction, seconds per step (steps
2..n), the timeline model's predicted seconds per step for this GPU (`planner.timeline`), pinned host memory.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time
from pathlib import Path

import common
import harness
from harness import Env, Report, gib

import torch

from trainer_core.training.comparison import Comparison
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.planner import GIB, PlanInputs, arch_from_transformer, auto_blocks_to_swap, plan_memory
from trainer_core.planner.phases import gpu_peak_after_caching

# Tiny dims for --tiny: a real Qwen-Image layout (16 latent channels, 2x2 patches) at toy width.
TINY_MODEL = dict(num_layers=4, num_attention_heads=2, attention_head_dim=16, axes_dims_rope=(8, 4, 4),
                  joint_attention_dim=32)
NOT_ALLOCATOR = ("allocator slack", "CUDA context")
SPEED_COLUMNS = ["configuration", "blocks_to_swap", "allocated_measured", "allocated_planned", "planned_over_measured",
                 "reserved_measured", "planned_total", "seconds_per_step", "predicted_seconds_per_step", "pinned_host",
                 "first_loss", "last_loss", "loss_vs_eager", "status"]


@dataclasses.dataclass(frozen=True)
class Config:
    label: str
    blocks_to_swap: int
    path: str = "eager"  # eager | fp8 activations | compiled | int8 compute
    comparison: Comparison = Comparison()
    storage: str = "float8"  # the block Linears' storage; "int8": ComfyUI's int8 ConvRot (the model converted first)
    budget: int | None = None  # the card it plays (bytes): run under that cap (harness.card_of); None: the whole device


def run_config(env: Env, config: Config, components, dataset, inputs: PlanInputs, arch) -> dict:
    from trainer_core.devtools.memprobe import LiveBytes
    from trainer_core.planner.timeline import (FP8_PATH, INT8_PATH, PATHS, RUNTIME, ComputePath, predict,
                                               profile_for_device)
    from trainer_core.streaming.placement import tail_placement
    from trainer_core.training import Trainer

    k = config.blocks_to_swap
    harness.release_cached(env)
    train = TrainConfig(seed=0, micro_batch_size=inputs.batch, gradient_checkpointing=inputs.checkpointing,
                        blocks_to_swap=k, run_name=f"gpu-speed-{k}", fp8_activations=config.path == "fp8 activations",
                        compile_float8=config.path == "compiled", int8_compute=config.path == "int8 compute")
    trainer = Trainer(components, dataset, LoraConfig(rank=inputs.rank, alpha=float(inputs.rank), targets=inputs.targets),
                      OptimizerConfig(optimizer=inputs.optimizer, learning_rate=1e-4), train, comparison=config.comparison)
    status = trainer.built.runner.fp8_status or ("compiled float8: on" if trainer.built.runner.compiled_float8 else "")
    path, placement = RUNTIME, None
    if config.path == "fp8 activations" and (trainer.built.runner.fp8_status or "").startswith("fp8 activations: on"):
        path = FP8_PATH
    elif config.path == "compiled" and trainer.built.runner.compiled_float8:
        path = PATHS[2]
    elif config.path == "int8 compute" and (trainer.built.runner.fp8_status or "").startswith("int8 compute: on"):
        path, inputs = INT8_PATH, dataclasses.replace(inputs, int8_compute=True)
    if config.comparison.lora_compute == "float32":
        path = ComputePath("float32", "eager")
    if config.comparison.placement == "tail" and k:
        placement = tail_placement(arch.num_blocks, k)
    if not config.comparison.modulation_ahead:
        inputs = dataclasses.replace(inputs, modulation_ahead=False)
    pinned = harness.pinned_bytes(env)
    if env.cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        first, rest, seconds = harness.timed_steps(env, trainer, env.steps)
        allocated, reserved = torch.cuda.max_memory_allocated(env.device), torch.cuda.max_memory_reserved(env.device)
    else:  # the CPU has no allocator statistics: resident tensors + the steps' peak of new tensors
        resident = common.resident_bytes(trainer)
        # torch.compile refuses to run under a TorchDispatchMode such as LiveBytes: a compiled row counts the
        # resident tensors only.
        with (contextlib.nullcontext() if trainer.built.runner.compiled_float8 else LiveBytes()) as live:
            first, rest, seconds = harness.timed_steps(env, trainer, env.steps)
        allocated = reserved = resident + (live.peak if live is not None else 0)
    losses = first.losses + rest.losses
    plan = plan_memory(dataclasses.replace(inputs, blocks_to_swap=k), arch)
    planned_alloc = sum(t.bytes for t in plan.gpu if t.name not in NOT_ALLOCATOR)
    profile = profile_for_device(torch.cuda.get_device_name(env.device)) if env.cuda else None
    if profile is not None and path == FP8_PATH and not profile.fp8_tflops:
        profile = None  # no float8 tensor cores in the model's profile: no prediction for this path
    predicted = (predict(dataclasses.replace(inputs, blocks_to_swap=k), profile, placement, arch, path).seconds
                 if profile is not None else None)
    trainer.close()
    del trainer
    return dict(configuration=config.label, blocks_to_swap=k, allocated_measured=gib(allocated, env),
                allocated_planned=gib(planned_alloc, env), planned_over_measured=round(planned_alloc / allocated, 3),
                reserved_measured=gib(reserved, env), planned_total=gib(plan.gpu_total, env),
                seconds_per_step=round(seconds, 4),
                predicted_seconds_per_step=None if predicted is None else round(predicted, 4),
                pinned_host=gib(pinned, env), first_loss=round(losses[0], 6), last_loss=round(losses[-1], 6),
                status=status, _losses=losses, _reserved=reserved)


def to_int8_convrot(model) -> None:
    """Every frozen block Linear of `model` as ComfyUI's int8 ConvRot file holds it (models/int8_convrot.py: rotated
    with group 256 where it divides the input features), quantised on its device from its current weight."""
    from trainer_core.models import int8_convrot
    from trainer_core.models.float8 import dequantized_weight, frozen_block_linears
    from trainer_core.models.streaming import assign_frozen_linear_weight

    for _, linear in frozen_block_linears(model):
        if linear.weight.dtype == torch.int8:
            continue
        group = int8_convrot.DEFAULT_GROUP if linear.in_features % int8_convrot.DEFAULT_GROUP == 0 else 0
        q, scale = int8_convrot.quantize(dequantized_weight(linear, torch.float32), group)
        if "weight_scale" in linear._buffers:
            del linear.weight_scale
        assign_frozen_linear_weight(linear, q, scale, group)


def run_speed(env: Env, report: Report, clock: harness.Clock, seconds: float | None = None) -> None:
    """The configurations above into `report`: table 'seconds per step' and its checks."""
    from trainer_core.devtools.random_weights import random_transformer
    from trainer_core.models.float8.compiled import available

    phase_started = clock.elapsed()

    def left() -> float:
        return min(clock.left(), float("inf") if seconds is None else seconds - (clock.elapsed() - phase_started))

    t = time.perf_counter()
    model = random_transformer({} if env.cuda else TINY_MODEL, storage="float8", compute_dtype=torch.bfloat16,
                               device=env.device, seed=0)
    latent_hw, text_tokens = ((128, 128), 256) if env.cuda else ((16, 16), 8)  # 1024 x 1024 -> 64 x 64 tokens
    components, dataset = common.synthetic_setup(model, samples=4, latent_hw=latent_hw, text_tokens=text_tokens,
                                                 device=env.device, compute_dtype=torch.bfloat16, storage="float8")
    arch = arch_from_transformer(model)
    side = latent_hw[0] * arch.vae_scale_factor
    inputs = PlanInputs(width=side, height=side, text_tokens=text_tokens, rank=32 if env.cuda else 4,
                        targets="attention+mlp", storage="float8", checkpointing=True, optimizer="adamw8bit",
                        device=env.device.type, cuda_context_bytes=env.context_bytes)
    report.note(f"speed: {arch.total_params:,d} parameters, {arch.num_blocks} blocks, random float8 block weights, "
                f"built in memory in {time.perf_counter() - t:.0f} s; {side}x{side} ({arch.image_tokens(side, side)} "
                f"image tokens), {text_tokens} text tokens, LoRA rank {inputs.rank}, {env.steps} steps per configuration")

    if env.cuda:
        budgets = [(f"auto for {g} GiB", g * GIB) for g in (24, 16)]
        as_planned = inputs
    else:  # the tiny budget: what automatic swapping must fit at 3 swapped blocks, read as a GPU's figures
        as_planned = dataclasses.replace(inputs, device="cuda", cuda_context_bytes=0, allocator_slack=0.0)
        budgets = [("auto (tiny budget)", gpu_peak_after_caching(  # previews in tiles, as the budget makes them
            plan_memory(dataclasses.replace(as_planned, blocks_to_swap=3), arch), arch, None, 1))]
    configs = []
    for label, budget in budgets:
        choice = auto_blocks_to_swap(as_planned, budget, arch)
        if not report.check(f"{label}: the planner finds a swap count", choice.fits, " ".join(choice.advice) or
                            f"{choice.blocks_to_swap} blocks"):
            continue
        configs.append(Config(f"{label} ({choice.blocks_to_swap} swapped)", choice.blocks_to_swap,
                              budget=budget if env.cuda else None))
    if env.tiny:  # a second streamed setting (see gpu_check.py: a second tiny budget would choose 3 or 0)
        configs.append(Config("2 swapped", 2))
    configs.append(Config("all resident (eager float8)", 0))
    configs.append(Config("all resident, fp8 activations", 0, path="fp8 activations"))
    if available(env.device):
        configs.append(Config("all resident, compiled float8", 0, path="compiled"))
    else:
        report.skip("speed: all resident, compiled float8", "the compiled path needs a CUDA GPU with Triton")
    # The comparisons at the most streamed choice (16 GiB; tiny: the tiny budget's), where streaming costs most.
    streamed = [c for c in configs if c.label.startswith("auto")][-1:] or [Config("all resident", 0)]
    configs += [Config(f"{streamed[0].label}, {c.label}", streamed[0].blocks_to_swap, comparison=c,
                       budget=streamed[0].budget) for c in
                (Comparison(placement="tail"), Comparison(lora_compute="float32"), Comparison(modulation_ahead=False))]
    # Last (the model's blocks are converted in place): ComfyUI's int8 ConvRot storage, resident and streamed, and int8
    # compute (TrainConfig.int8_compute, opt-in) on those weights, all resident and at the planner's float8 choices for
    # the budgets (the same swap counts, so its s/step sits beside the eager rows of the same placement).
    chosen = [c for c in configs if c.label.startswith("auto") and c.comparison == Comparison()]
    configs += [Config("all resident, int8 ConvRot blocks", 0, storage="int8"),
                Config("all resident, int8 compute", 0, path="int8 compute", storage="int8"),
                *(Config(f"{c.label}, int8 compute", c.blocks_to_swap, path="int8 compute", storage="int8",
                         budget=c.budget) for c in chosen),
                Config(f"{streamed[0].label}, int8 ConvRot blocks", streamed[0].blocks_to_swap, storage="int8",
                       budget=streamed[0].budget)]

    rows = report.table("seconds per step", SPEED_COLUMNS)
    longest = None
    for config in configs:
        if longest is not None and left() < longest:
            report.cut_phase(f"speed: {config.label}", f"{left():.0f} s left of the speed slice, the longest "
                             f"configuration took {longest:.0f} s")
            continue
        t = time.perf_counter()
        if config.storage == "int8":
            to_int8_convrot(model)  # idempotent: the int8 configurations come last
        out_of_memory = None
        try:
            with harness.card_of(env, config.budget):
                rows.append(run_config(env, config, components, dataset,
                                       dataclasses.replace(inputs, storage=config.storage), arch))
        except torch.cuda.OutOfMemoryError as e:  # a failed check, and the next configuration still runs
            out_of_memory = str(e).splitlines()[0][:200]
        if out_of_memory is not None:
            report.check(f"{config.label}: runs under its card's cap", False, f"out of memory: {out_of_memory}")
            harness.release_cached(env)
            continue
        r = rows[-1]
        longest = max(longest or 0.0, time.perf_counter() - t)
        print(f"  {config.label}: {r['seconds_per_step']:.3f} s/step (predicted {r['predicted_seconds_per_step']}), "
              f"{r['allocated_measured']} allocated, planned {r['allocated_planned']} ({time.perf_counter() - t:.0f} s)",
              flush=True)
    speed_checks(env, report, rows, budgets)
    for r in rows:
        r.pop("_losses")
        r.pop("_reserved")


def speed_checks(env: Env, report: Report, rows: list[dict], budgets) -> None:
    eager = next((r for r in rows if r["configuration"] == "all resident (eager float8)"), None)
    for r in rows:
        finite = all(x == x and abs(x) != float("inf") for x in r["_losses"])
        report.check(f"{r['configuration']}: losses finite", finite, f"{r['first_loss']} -> {r['last_loss']}")
        # Not planned: the compiled path's buffers, and peft's fp32 copies of the LoRA inputs (the planner plans
        # the default, LoRA computing in the compute dtype).
        if not any(x in r["configuration"] for x in ("compiled", "LoRA in float32")):
            # int8 compute on the CPU's tiny dims: its largest call's product beyond the backward's working memory
            # is a larger share of the step there (1.052 measured at 3 swapped, 1.049 for int8 ConvRot storage alone).
            limit = 1.15 if env.cuda else 1.06 if "int8 compute" in r["configuration"] else 1.05
            report.check(f"{r['configuration']}: planned allocated within {limit - 1:.0%} above measured",
                         1.0 <= r["planned_over_measured"] <= limit, f"planned / measured {r['planned_over_measured']}")
        if eager is not None and r is not eager:
            rel = max(abs(a - b) / abs(b) for a, b in zip(r["_losses"], eager["_losses"]))
            r["loss_vs_eager"] = f"{rel:.2e}"
            # The float8 paths change the matmuls' rounding (fp8 activations: a few percent per matmul); the
            # comparisons and streaming compute the same values.
            limit = (0.05 if any(x in r["configuration"] for x in ("fp8 activations", "int8"))
                     else (1e-2 if env.cuda else 1e-6))  # int8: other weights (the same values, quantised again)
            report.check(f"{r['configuration']}: losses against the eager all-resident ones (same batches)",
                         rel <= limit, f"largest relative difference {rel:.2e} (limit {limit:g})")
    for label, budget in budgets:
        row = next((r for r in rows if r["configuration"].startswith(label + " (")), None)
        if env.cuda and row is not None:
            used = row["_reserved"] + env.context_bytes
            report.check(f"{row['configuration']}: within its budget (reserved + context)", used <= budget,
                         f"{used / GIB:.2f} of {budget / GIB:.2f} GiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(parser, str(Path(__file__).resolve().parent / "gpu_speed_check_out"))
    args = parser.parse_args(argv)
    env = harness.make_env(args, "gpu_speed_check.py")
    report = Report(f"GPU check: seconds per step ({'tiny, CPU' if env.tiny else 'real-size Qwen-Image'})", env,
                    "python benchmarks/gpu_speed_check.py" + (" --tiny" if env.tiny else ""))
    run_speed(env, report, harness.Clock(args.seconds))
    return 0 if report.write(args.out, "gpu_speed_check").startswith("VERDICT: PASS") else 1


if __name__ == "__main__":
    raise SystemExit(main())
