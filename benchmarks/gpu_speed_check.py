"""GPU check of the timeline model and block streaming, real-size Qwen-Image, random float8 weights (speed;
`gpu_check.py` checks memory phase by phase).

    python benchmarks/gpu_speed_check.py [--out benchmarks/gpu_speed_check_results.md]   # CUDA (H100/H200), < 8 min
    python benchmarks/gpu_speed_check.py --tiny [--compiled-on-cpu]                  # CPU, tiny dims, same code path

Builds the real transformer (60 blocks, 20.4B parameters) directly on the GPU with random float8 block
weights (`devtools.random_weights.random_transformer`: meta first, then one tensor at a time; no
download), and trains 5 steps of a rank-32 attention+mlp LoRA at 1024 x 1024 (64 x 64 = 4096 packed latent tokens, 16
latent channels, 256 prompt tokens x 3584, all synthetic) through our `Trainer` (`lora.inject_lora`,
`streaming.runner.BlockRunner` with gradient checkpointing) for blocks_to_swap in {0, 8, 16, auto for 16 GiB}, then
variants of the auto configuration, one change of issue 10 undone or added each: the streamed blocks as the last
ones (tail) instead of spread, the LoRA computed in fp32 (peft's cast) instead of bf16, every forward copying
whole blocks (no modulation ahead), the compiled float8 path (`models.float8.compiled`, where available; on the
CPU with --tiny --compiled-on-cpu), and fp8 activations (`TrainConfig.fp8_activations`: the frozen Linears
multiply in float8 with torch._scaled_mm; its losses are compared with the auto row's, same batches).
The model is built once; each configuration gets a fresh Trainer, whose `close()` takes the LoRA out and
`BlockRunner.uninstall()` gives the blocks back, so the next one starts from the same model.

Per configuration: torch.cuda.max_memory_allocated / max_memory_reserved over the steps (peak stats reset
after the trainer is built), the planner's prediction (its allocated part, and its total with allocator
slack and CUDA context), seconds per step (steps 2..n), the timeline model's predicted seconds per step for this
GPU (`planner.timeline`, profile chosen by the device name), and the pinned host memory of the CPU masters.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import platform
import time
from pathlib import Path

import common  # puts the repository on sys.path; resident_bytes

import torch

from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.devtools.random_weights import random_transformer
from trainer_core.planner import GIB, MIB, PlanInputs, arch_from_transformer, auto_blocks_to_swap, plan_memory
from trainer_core.planner.phases import gpu_peak_after_caching
from trainer_core.training import Trainer

# Tiny dims for --tiny: a real Qwen-Image layout (16 latent channels, 2x2 patches) at toy width.
TINY_MODEL = dict(num_layers=4, num_attention_heads=2, attention_head_dim=16, axes_dims_rope=(8, 4, 4),
                  joint_attention_dim=32)
NOT_ALLOCATOR = ("allocator slack", "CUDA context")


@dataclasses.dataclass
class Row:
    label: str
    blocks_to_swap: int
    planned_allocated: int  # planner total without allocator slack and CUDA context
    planned_total: int
    measured_allocated: int  # max_memory_allocated (CUDA) or the steps' live-bytes peak + resident (CPU)
    measured_reserved: int
    seconds_per_step: float
    pinned_host: int
    losses: list[float]
    predicted_seconds: float | None = None


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def pinned_bytes(cuda: bool) -> int:
    if not cuda:
        return 0
    stats = torch.cuda.host_memory_stats()
    return int(stats.get("allocated_bytes.current", stats.get("allocated_bytes.all.current", 0)))


def run_config(label: str, k: int, components, dataset, inputs: PlanInputs, arch, steps: int, cuda: bool,
               variant: str = "", compile_on_cpu: bool = False) -> Row:
    """One configuration. `variant`: "" (the trainer as it is), "tail" (streamed blocks = the last k), "lora fp32"
    (peft's fp32 LoRA compute), "compiled" (compiled float8 blocks), "fp8" (fp8 activations), "no modulation ahead"
    (every forward copies the streamed blocks whole). The timed steps are one chunk: its first step computes the
    modulation outputs for the window (up to 16 steps), as in the model, which averages over windows of 16."""
    from trainer_core.devtools.memprobe import LiveBytes
    from trainer_core.adapters.lora import compute_in_input_dtype
    from trainer_core.streaming.runner import BlockRunner
    from trainer_core.planner.timeline import FP8_PATH, PATHS, RUNTIME, ComputePath, predict, profile_for_device
    from trainer_core.streaming.placement import tail_placement

    device = components.device
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        if hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()  # pinned blocks of the previous configuration, cached by torch
    trainer = Trainer(components, dataset, LoraConfig(rank=inputs.rank, alpha=float(inputs.rank), targets=inputs.targets),
                      OptimizerConfig(optimizer=inputs.optimizer, learning_rate=1e-4),
                      TrainConfig(seed=0, micro_batch_size=inputs.batch, gradient_checkpointing=inputs.checkpointing,
                                  blocks_to_swap=k, run_name=f"gpu-check-{k}", fp8_activations=variant == "fp8"))
    placement, path = None, RUNTIME
    if variant in ("tail", "compiled"):
        trainer.runner.uninstall()
        placement = tail_placement(arch.num_blocks, k) if variant == "tail" and k else None
        trainer.runner = BlockRunner(trainer.transformer, device, blocks_to_swap=k, checkpointing=inputs.checkpointing,
                                     placement=placement, compile_float8=variant == "compiled",
                                     compile_on_cpu=compile_on_cpu)
        assert trainer.runner.compiled_float8 == (variant == "compiled")
        if variant == "compiled":
            path = PATHS[2]
    elif variant == "no modulation ahead":
        trainer.modulation_window = 0
        inputs = dataclasses.replace(inputs, modulation_ahead=False)
    elif variant == "fp8":
        print(f"  {trainer.runner.fp8_status}", flush=True)
        if trainer.runner.fp8_status.startswith("fp8 activations: on"):
            path = FP8_PATH
    elif variant == "lora fp32":
        compute_in_input_dtype(trainer.transformer, enabled=False)
        path = ComputePath("float32", "eager")
    pinned = pinned_bytes(cuda)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        report = trainer.train(1)  # first step: kernels' warm-up (and compilation), optimizer state allocation
        torch.cuda.synchronize()
        t = time.perf_counter()
        report2 = trainer.train(steps - 1)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - t) / (steps - 1)
        allocated, reserved = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
    else:  # the CPU has no allocator statistics: resident tensors + the steps' peak of new tensors
        resident = common.resident_bytes(trainer)
        # torch.compile refuses to run under a TorchDispatchMode such as LiveBytes: the compiled variant's row
        # counts the resident tensors only.
        probe = contextlib.nullcontext() if variant == "compiled" else LiveBytes()
        with probe as live:
            report = trainer.train(1)
            t = time.perf_counter()
            report2 = trainer.train(steps - 1)
            seconds = (time.perf_counter() - t) / (steps - 1)
        allocated = reserved = resident + (live.peak if live is not None else 0)
    losses = report.losses + report2.losses
    plan = plan_memory(dataclasses.replace(inputs, blocks_to_swap=k), arch)
    planned_alloc = sum(t.bytes for t in plan.gpu if t.name not in NOT_ALLOCATOR)
    profile = profile_for_device(torch.cuda.get_device_name(device)) if cuda else None
    if profile is not None and path == FP8_PATH and not profile.fp8_tflops:
        profile = None  # no float8 tensor cores in the model's profile: no prediction for this path
    predicted = (predict(dataclasses.replace(inputs, blocks_to_swap=k), profile, placement, arch, path).seconds
                 if profile is not None else None)
    trainer.close()
    del trainer
    return Row(label, k, planned_alloc, plan.gpu_total, allocated, reserved, seconds, pinned, losses, predicted)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny dims on the CPU (exercises the same code path)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "gpu_speed_check_results.md"))
    parser.add_argument("--steps", type=int, default=None, help="steps per configuration (default 5, tiny 3)")
    parser.add_argument("--budget-gb", type=float, default=16.0, help="budget of the 'auto' configuration (GiB)")
    parser.add_argument("--compiled-on-cpu", action="store_true",
                        help="with --tiny: add the compiled float8 variant on the CPU (Inductor's C++ backend; slow to compile)")
    args = parser.parse_args(argv)

    from trainer_core.runs.cli import _quiet_libraries

    _quiet_libraries()
    cuda = not args.tiny
    if cuda and not torch.cuda.is_available():
        raise SystemExit("gpu_speed_check.py needs a CUDA device; run it with --tiny to exercise the code path on a CPU")
    device = torch.device("cuda" if cuda else "cpu")
    steps = args.steps or (5 if cuda else 3)
    started = time.perf_counter()
    lines: list[str] = []

    def log(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    if cuda:
        torch.cuda.init()
        free0, total0 = torch.cuda.mem_get_info(device)
        context = total0 - free0 - torch.cuda.memory_reserved(device)
        hardware = f"{torch.cuda.get_device_name(device)}, {total0 / GIB:.1f} GiB"
    else:
        context, hardware = 0, f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"

    # Model and data.
    t = time.perf_counter()
    config = {} if cuda else TINY_MODEL
    model = random_transformer(config, storage="float8", compute_dtype=torch.bfloat16, device=device, seed=0)
    latent_hw, text_tokens = ((128, 128), 256) if cuda else ((16, 16), 8)  # 1024 x 1024 -> 64 x 64 tokens
    components, dataset = common.synthetic_setup(model, samples=4, latent_hw=latent_hw, text_tokens=text_tokens,
                                                 device=device, compute_dtype=torch.bfloat16, storage="float8")
    arch = arch_from_transformer(model)
    side = latent_hw[0] * arch.vae_scale_factor
    inputs = PlanInputs(width=side, height=side, text_tokens=text_tokens, rank=32 if cuda else 4,
                        targets="attention+mlp", storage="float8", checkpointing=True, optimizer="adamw8bit",
                        device=device.type, cuda_context_bytes=context if cuda else 0)
    build_s = time.perf_counter() - t
    log(f"# GPU check: {'real Qwen-Image' if cuda else 'tiny (--tiny)'} on {hardware}")
    log("")
    log(f"`python benchmarks/gpu_speed_check.py{' --tiny' if args.tiny else ''}`, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}. Model: {arch.total_params:,d} parameters, "
        f"{arch.num_blocks} blocks, random float8 block weights, built in {build_s:.0f} s. Training: {side}x{side} "
        f"({arch.image_tokens(side, side)} image tokens), {text_tokens} text tokens, LoRA rank {inputs.rank} "
        f"attention+mlp fp32, AdamW8bit, gradient checkpointing, batch 1, {steps} steps per configuration.")
    if cuda:
        log(f"CUDA context and other memory outside torch's allocator at start: {context / MIB:.0f} MiB "
            f"(the planner used this measured figure instead of its assumption).")
    log("")

    # The 'auto' configuration: the planner's choice for the budget (tiny: a budget that needs swapping).
    if cuda:
        budget = int(args.budget_gb * GIB)
        auto_label = f"auto for {args.budget_gb:g} GiB"
    else:
        # What automatic swapping must fit at 3 swapped blocks (training and the preview after it), with the
        # CPU's figures read as a GPU's (no context, no slack): the CPU itself has no budget.
        as_gpu = dataclasses.replace(inputs, device="cuda", cuda_context_bytes=0, allocator_slack=0.0)
        budget = gpu_peak_after_caching(plan_memory(dataclasses.replace(as_gpu, blocks_to_swap=3), arch), arch)
        auto_label = "auto (tiny budget)"
    choice = auto_blocks_to_swap(inputs if cuda else as_gpu, budget, arch)
    if not choice.fits:
        raise SystemExit("\n".join(choice.advice))
    configs = [("no swapping", 0), ("8 swapped", 8), ("16 swapped", 16), (auto_label, choice.blocks_to_swap)] if cuda \
        else [("no swapping", 0), ("1 swapped", 1), ("2 swapped", 2), (auto_label, choice.blocks_to_swap)]
    configs = [(label, k, "") for label, k in configs]
    auto_k = choice.blocks_to_swap
    configs += [(f"{auto_label}, tail placement", auto_k, "tail"), (f"{auto_label}, LoRA in fp32", auto_k, "lora fp32"),
                (f"{auto_label}, no modulation ahead", auto_k, "no modulation ahead")]
    from trainer_core.models.float8.compiled import available

    compile_on_cpu = args.tiny and args.compiled_on_cpu
    if available(device, allow_cpu=compile_on_cpu):
        configs.append((f"{auto_label}, compiled float8", auto_k, "compiled"))
    configs.append((f"{auto_label}, fp8 activations", auto_k, "fp8"))

    unit, u = (GIB, "GiB") if cuda else (MIB, "MiB")
    rows = []
    for label, k, variant in configs:
        t = time.perf_counter()
        rows.append(run_config(label, k, components, dataset, inputs, arch, steps, cuda, variant, compile_on_cpu))
        r = rows[-1]
        print(f"  {label}: blocks_to_swap={k}, measured {r.measured_allocated / unit:.2f} {u} allocated, planned "
              f"{r.planned_allocated / unit:.2f} {u}, {r.seconds_per_step:.3f} s/step ({time.perf_counter() - t:.0f} s)",
              flush=True)

    log(f"| configuration | blocks_to_swap | max allocated ({u}) | planned allocated ({u}) | planned / measured "
        f"| max reserved ({u}) | planned total ({u}) | s/step | pinned host ({u}) | loss (first, last) "
        f"| predicted s/step |")
    log("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        log(f"| {r.label} | {r.blocks_to_swap} | {r.measured_allocated / unit:.2f} | {r.planned_allocated / unit:.2f} | "
            f"{r.planned_allocated / r.measured_allocated:.3f} | {r.measured_reserved / unit:.2f} | "
            f"{r.planned_total / unit:.2f} | {r.seconds_per_step:.3f} | {r.pinned_host / unit:.2f} | "
            f"{r.losses[0]:.4f}, {r.losses[-1]:.4f} | "
            f"{'-' if r.predicted_seconds is None else f'{r.predicted_seconds:.3f}'} |")
    log("")
    fp8, auto = rows[-1], rows[3]
    rel = [abs(a - b) / abs(b) for a, b in zip(fp8.losses, auto.losses)]
    log(f"fp8 activations against the auto configuration (same batches): losses {', '.join(f'{x:.4f}' for x in fp8.losses)} "
        f"vs {', '.join(f'{x:.4f}' for x in auto.losses)}; max relative difference {max(rel):.2e}; "
        f"{fp8.seconds_per_step:.3f} vs {auto.seconds_per_step:.3f} s/step.")
    if cuda:
        within = auto.measured_reserved + context <= budget
        log(f"The auto configuration ({auto.blocks_to_swap} blocks) used {(auto.measured_reserved + context) / GIB:.2f} GiB "
            f"(max reserved + context) of its {budget / GIB:.2f} GiB budget: {'within' if within else 'OVER'} budget.")
    else:
        log("CPU: 'max allocated' is the bytes of the model's resident tensors plus the steps' peak of new tensors "
            "(`memprobe.LiveBytes`; the compiled variant: resident tensors only, as torch.compile refuses that probe); the "
            "planner ran with device='cpu' (no context, no slack).")
    log(f"Total time {time.perf_counter() - started:.0f} s.")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
