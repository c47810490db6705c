"""Accuracy of int8 compute (`TrainConfig.int8_compute`, `models/int8_compute.py`) against the bf16/fp32 compute of the
same weights, on the CPU (where torch._int_mm runs). Writes markdown (stdout, and --out).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/int8_compute_accuracy.py [--steps 100] [--out FILE]

1. Real-width Linears (Qwen-Image's 3072 -> 3072, 3072 -> 12288, 12288 -> 3072) on 256 tokens whose activations have
   real-like outliers (a few channels 30x the rest, as DiT activations have; Gaussian otherwise), the weight an int8
   ConvRot file's (group 256): the output's relative error (Frobenius) with int8 compute against bf16 compute of the same
   dequantised weight, with the activation rotated (the path) and without (for scale).
2. The shipped shapes model (pretrained/, fp32 compute on the CPU, the demo's star recipe: 8 star pictures a step, LoRA
   rank 8 on attention + MLP), its block weights held in int8 for both runs: the first loss and the first step's LoRA
   gradients, the loss curve over --steps, and the star measure of the demo's preview (devtools/shapes.measure: the
   shape read, and its fit to a star) for the int8-trained LoRA evaluated with int8 compute, evaluated with the eager
   compute (the same LoRA on the same weights; as ComfyUI runs a LoRA on a bf16 or fp8 file), and the eager-trained one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer_core.models import int8_compute as ic  # noqa: E402
from trainer_core.models.float8 import SCALE_BUFFER, FrozenLinearFunction, dequantized_weight  # noqa: E402
from trainer_core.models.float8 import install_frozen_compute, set_rotation_group  # noqa: E402
from trainer_core.models.int8_convrot import quantize  # noqa: E402

SHAPES = ((3072, 3072), (3072, 12288), (12288, 3072))  # (in, out) of Qwen-Image's block Linears
TOKENS = 256
OUTLIER_CHANNELS, OUTLIER_SCALE = 4, 30.0


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def real_width_linear(fan_in: int, fan_out: int, group: int, seed: int = 0) -> torch.nn.Linear:
    g = torch.Generator().manual_seed(seed)
    linear = torch.nn.Linear(fan_in, fan_out, dtype=torch.bfloat16)
    q, scale = quantize(torch.randn(fan_out, fan_in, generator=g) * 0.02, group)
    linear.weight = torch.nn.Parameter(q, requires_grad=False)
    linear.register_buffer(SCALE_BUFFER, scale)
    set_rotation_group(linear, group)
    with torch.no_grad():
        linear.bias.copy_(torch.randn(fan_out, generator=g) * 0.01)
    install_frozen_compute(linear)
    return linear


def outlier_activations(fan_in: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(TOKENS, fan_in, generator=g)
    channels = torch.randperm(fan_in, generator=g)[:OUTLIER_CHANNELS]
    x[:, channels] *= OUTLIER_SCALE
    return x.bfloat16()


def linear_section(log) -> None:
    log("### Real-width Linears, 256 tokens, 4 outlier channels at 30x (bf16 compute as the reference)")
    log("")
    log("| in -> out | int8 compute, rotated (group 256) | int8 compute, no rotation | bf16 compute, plain |")
    log("| --- | --- | --- | --- |")
    for fan_in, fan_out in SHAPES:
        x = outlier_activations(fan_in)
        errors = []
        for group in (256, 0):
            linear = real_width_linear(fan_in, fan_out, 256)  # the file's weight: rotated, group 256
            reference = torch.nn.functional.linear(x.float(), dequantized_weight(linear, torch.float32),
                                                   linear.bias.float())
            if group == 0:  # the activations quantised unrotated against the unrotated weight (for scale)
                w = dequantized_weight(linear, torch.float32)
                q, scale = quantize(w, 0)
                linear.weight = torch.nn.Parameter(q, requires_grad=False)
                linear.weight_scale = scale
                set_rotation_group(linear, 0)
                reference = torch.nn.functional.linear(x.float(), dequantized_weight(linear, torch.float32),
                                                       linear.bias.float())
            y = ic.int8_linear(x, linear)
            errors.append(relative_error(y, reference))
        bf16 = torch.nn.functional.linear(x, dequantized_weight(linear, torch.bfloat16), linear.bias)
        errors.append(relative_error(bf16, reference))
        log(f"| {fan_in} -> {fan_out} | " + " | ".join(f"{e:.2e}" for e in errors) + " |")
    log("")


class _EagerShim:
    """Int8ComputeFunction's stand-in for evaluating with the eager compute: the same Linears, FrozenLinearFunction."""

    @staticmethod
    def apply(x, linear, kernels):
        return FrozenLinearFunction.apply(x, linear)


def shapes_run(int8: bool, steps: int, work: Path):
    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.data.cache import build_cache
    from trainer_core.devtools import shapes
    from trainer_core.families.loading import LoadRequest, load_model_set
    from trainer_core.runs.demo import SHAPES_SOURCE, STAR_PROMPT, shapes_demo
    from trainer_core.training import Trainer

    components = load_model_set(LoadRequest(SHAPES_SOURCE, "cpu", storage="float8", compute_dtype="float32"))
    spec = shapes_demo()
    samples, settings = spec.make_dataset(work / "dataset")
    cached = build_cache(components, samples, work / f"cache{int8}", preview_prompts=[STAR_PROMPT], settings=settings)
    ic.store_int8(components.ensure_transformer(torch.device("cpu")))  # both runs on the same int8-held weights
    trainer = Trainer(components, cached, LoraConfig(rank=8, alpha=8.0, targets=spec.lora_targets),
                      OptimizerConfig(optimizer="adamw8bit", learning_rate=spec.learning_rate, warmup_steps=10,
                                      schedule=spec.schedule, schedule_steps=200, min_lr_ratio=0.1),
                      TrainConfig(seed=0, micro_batch_size=spec.micro_batch_size, gradient_checkpointing=True,
                                  blocks_to_swap=0, int8_compute=int8))
    grads = {}
    hooks = [p.register_hook(lambda g, i=i: grads.setdefault(i, g.detach().float().clone()))
             for i, p in enumerate(trainer.built.params)]
    losses = trainer.train(1).losses
    for h in hooks:
        h.remove()
    losses += trainer.train(steps - 1).losses
    grad = torch.cat([grads[i].reshape(-1) for i in sorted(grads)])

    def star(image):
        m = shapes.measure(image, "white")
        return f"{m.shape} (fit {m.star_fit:.3f})"

    def preview():
        return trainer.sample_preview(STAR_PROMPT, "", width=64, height=64, steps=20, cfg_scale=4.0, seed=0)

    stars = {"own compute": star(preview())}
    if int8:
        real = ic.Int8ComputeFunction
        ic.Int8ComputeFunction = _EagerShim  # evaluated with the eager compute on the same weights
        try:
            stars["eager compute"] = star(preview())
        finally:
            ic.Int8ComputeFunction = real
    status = trainer.built.runner.fp8_status
    trainer.close()
    return losses, grad, stars, status


def shapes_section(steps: int, log) -> None:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        int8 = shapes_run(True, steps, Path(tmp))
        eager = shapes_run(False, steps, Path(tmp))
    log(f"### Shapes model (pretrained/), the demo's star recipe, {steps} steps, fp32 compute as the reference "
        f"({time.perf_counter() - t0:.0f} s for both runs)")
    log("")
    log(f"int8 run status: {int8[3]}")
    log("")
    rel = [abs(a - b) / abs(b) for a, b in zip(int8[0], eager[0])]
    log("| measure | int8 compute | eager compute (same int8-held weights) | relative difference |")
    log("| --- | --- | --- | --- |")
    log(f"| first loss | {int8[0][0]:.5f} | {eager[0][0]:.5f} | {rel[0]:.2e} |")
    log(f"| first step's LoRA gradients (norm) | {int8[1].norm():.4e} | {eager[1].norm():.4e} | "
        f"{relative_error(int8[1], eager[1]):.2e} |")
    log(f"| last loss (step {steps}) | {int8[0][-1]:.5f} | {eager[0][-1]:.5f} | {rel[-1]:.2e} |")
    log(f"| mean loss over the run | {sum(int8[0]) / steps:.5f} | {sum(eager[0]) / steps:.5f} | "
        f"max {max(rel):.2e}, mean {sum(rel) / steps:.2e} |")
    log(f"| star preview, the int8-trained LoRA with int8 compute | {int8[2]['own compute']} | | |")
    log(f"| star preview, the int8-trained LoRA with eager compute | {int8[2]['eager compute']} | | |")
    log(f"| star preview, the eager-trained LoRA | | {eager[2]['own compute']} | |")
    log("")
    log("| step | " + " | ".join(str(s) for s in range(0, steps, max(1, steps // 10))) + " |")
    log("| --- |" + " --- |" * len(range(0, steps, max(1, steps // 10))))
    for name, run in (("int8", int8), ("eager", eager)):
        log(f"| {name} | " + " | ".join(f"{run[0][s]:.4f}" for s in range(0, steps, max(1, steps // 10))) + " |")
    log("")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--skip-shapes", action="store_true", help="only the real-width Linears")
    parser.add_argument("--skip-linears", action="store_true", help="only the shapes model")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    lines: list[str] = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    torch.manual_seed(0)
    log(f"## int8 compute accuracy (CPU, torch {torch.__version__})")
    log("")
    if not args.skip_linears:
        linear_section(log)
    if not args.skip_shapes:
        shapes_section(args.steps, log)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
