"""Quality of float8 activations (`TrainConfig.fp8_activations`, `models.float8.activations`) against bf16 compute
on the same float8 weights: the issue-10 check "loss against bf16 compute on the same batches".

    .venv/bin/python benchmarks/fp8_activations_quality.py [--steps 100] [--tokens 256]   # CPU, ~6 min, 2.4 GB

1. The tiny model (`build_tiny_components`, seed 0) trained twice from the same seed on the generated demo dataset,
   bf16 compute, once on the eager float8 path and once with fp8_activations: same data order, noise and timesteps
   (the trainer's generators do not depend on the compute), so per-step losses compare batch for batch. Printed:
   every step's loss, the largest relative loss difference, and the final LoRA difference
   ||dW_fp8 - dW_bf16|| / ||dW_bf16|| over all adapted modules (dW = B A, the LoRA's weight change). For scale,
   the same figures between float8 and float8_scaled storage, both on the eager path (an accepted difference).
   float8 and float8_scaled storage, a streamed block, checkpointing, 8-bit AdamW: the demo's settings.
2. One real-width block (D = 3072), random N(0, 0.02) weights stored float8 and float8_scaled (as `memory_cpu.py`),
   inputs N(0, 1) in bf16: the relative output error ||y - y_ref|| / ||y_ref|| of fp8 activations (rowwise and
   tensorwise activation scales) against bf16 compute on the same float8 weights, and for scale the error of the
   float8 storage itself (bf16 compute on the bf16 weights). Also the input gradient's error (backward runs in bf16
   on both paths, so it differs only through the forward's values).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)

import torch


def relative(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref.float()).norm() / ref.float().norm())


# --------------------------------------------------------------------------------------------------
# 1. the tiny model, trained


def lora_deltas(trainer) -> dict[str, torch.Tensor]:
    """dW = B A per adapted module (scale left out: the same in both runs), fp32 (out, in)."""
    params = dict(zip(trainer.built.param_names, trainer.built.params))
    out = {}
    for name, a in params.items():
        if ".lora_A." in name:
            b = params[name.replace(".lora_A.", ".lora_B.")]
            out[name.split(".lora_A.")[0]] = b.detach().float() @ a.detach().float()
    return out


def delta_difference(one: dict, two: dict) -> float:
    num = sum(float((one[k] - two[k]).square().sum()) for k in two)
    den = sum(float(two[k].square().sum()) for k in two)
    return (num / den) ** 0.5


def train_tiny(storage: str, fp8_activations: bool, steps: int, work: Path) -> tuple[list[float], dict, str]:
    from trainer_core.data.cache import build_cache
    from trainer_core.core.config import DatasetConfig, LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.data.images import discover
    from trainer_core.runs.demo import make_demo_dataset
    from trainer_core.families.qwen_image import build_tiny_components
    from trainer_core.training import Trainer

    components = build_tiny_components(seed=0, storage=storage, compute_dtype=torch.bfloat16)
    folder = make_demo_dataset(work / "dataset")
    cached = build_cache(components, discover(DatasetConfig(folder=str(folder), resolution=64, min_bucket_side=32,
                                                            max_bucket_side=128)), work / "cache")
    trainer = Trainer(components, cached, LoraConfig(rank=8, alpha=8.0, targets="all"),
                      OptimizerConfig(optimizer="adamw8bit", learning_rate=2e-3, warmup_steps=10, schedule="cosine",
                                      schedule_steps=200, min_lr_ratio=0.1),
                      TrainConfig(seed=0, micro_batch_size=2, gradient_checkpointing=True, blocks_to_swap=1,
                                  fp8_activations=fp8_activations))
    status = trainer.built.runner.fp8_status or "fp8 activations: off"
    losses = trainer.train(steps).losses
    deltas = lora_deltas(trainer)
    trainer.close()
    return losses, deltas, status


def tiny_section(steps: int, log) -> None:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {(storage, fp8): train_tiny(storage, fp8, steps, Path(tmp))
                for storage in ("float8", "float8_scaled") for fp8 in (False, True)}
    seconds = time.perf_counter() - t0
    log(f"### Tiny model, {steps} steps, bf16 compute ({seconds:.0f} s for the four runs)")
    log("")
    log(f"fp8 run status: {runs[('float8', True)][2]}")
    log("")
    log("| step | float8, bf16 compute | float8, fp8 activations | float8_scaled, bf16 compute | "
        "float8_scaled, fp8 activations |")
    log("| --- | --- | --- | --- | --- |")
    order = [("float8", False), ("float8", True), ("float8_scaled", False), ("float8_scaled", True)]
    for i in range(steps):
        log(f"| {i + 1} | " + " | ".join(f"{runs[k][0][i]:.5f}" for k in order) + " |")
    log("")
    log("| comparison (same batches) | max relative loss difference | mean | final LoRA difference |")
    log("| --- | --- | --- | --- |")
    pairs = [("fp8 activations vs bf16 compute, float8 storage", ("float8", True), ("float8", False)),
             ("fp8 activations vs bf16 compute, float8_scaled storage", ("float8_scaled", True), ("float8_scaled", False)),
             ("for scale: float8 vs float8_scaled storage, both bf16 compute", ("float8", False), ("float8_scaled", False))]
    for label, one, two in pairs:
        rel = [abs(a - b) / abs(b) for a, b in zip(runs[one][0], runs[two][0])]
        log(f"| {label} | {max(rel):.2e} | {sum(rel) / len(rel):.2e} | "
            f"{delta_difference(runs[one][1], runs[two][1]):.2e} |")
    log("")


# --------------------------------------------------------------------------------------------------
# 2. one real-width block


def block_section(tokens: int, log, heads: int = 24) -> None:
    """`heads` x 128 wide (24: the real 3072)."""
    from trainer_core.devtools.random_weights import random_transformer
    from trainer_core.models.float8 import activations as fa
    from trainer_core.models.float8 import frozen_block_linears, store_block_linears

    side = int(tokens ** 0.5)
    grid, n_txt = (side, side), 32
    g = torch.Generator().manual_seed(1)
    width = heads * 128
    hidden = torch.randn(1, side * side, width, generator=g).bfloat16()  # (B, N_img, D)
    prompt = torch.randn(1, n_txt, width, generator=g).bfloat16()  # (B, N_txt, D)
    temb = torch.randn(1, width, generator=g).bfloat16()  # (B, D)
    probe = torch.randn(1, n_txt + side * side, width, generator=g)  # a fixed direction for the input gradient

    def run(model) -> tuple[torch.Tensor, torch.Tensor]:
        """(output (B, N_txt + N_img, D), d(output . probe)/d hidden (B, N_img, D))."""
        rope = model.pos_embed([(1, *grid)], max_txt_seq_len=n_txt, device=torch.device("cpu"))
        x = hidden.clone().requires_grad_(True)
        txt, img = model.transformer_blocks[0](x, prompt, None, temb, rope)
        out = torch.cat([txt, img], dim=1)
        (grad,) = torch.autograd.grad((out.float() * probe).sum(), x)
        return out.detach().float(), grad.float()

    rows = []
    t0 = time.perf_counter()
    for storage in ("float8", "float8_scaled"):
        model = random_transformer(dict(num_layers=1, num_attention_heads=heads), storage="bfloat16", seed=0, std=0.02)
        bf16_weights = run(model)
        store_block_linears(model, storage)  # the same weights, now float8: the eager path, bf16 compute
        eager = run(model)
        linears = [lin for _, lin in frozen_block_linears(model)]
        results = {}
        for scaling in fa.SCALINGS:
            installed = fa.install(linears, scaling)
            assert len(installed) == len(linears)
            results[scaling] = run(model)
            fa.uninstall(installed)
        rows.append((storage, bf16_weights, eager, results))
        del model
    seconds = time.perf_counter() - t0

    log(f"### One {'real-width ' if heads == 24 else ''}block (D = {width}), {side * side} image + {n_txt} text tokens ({seconds:.0f} s)")
    log("")
    log("| storage | output error, fp8 rowwise vs bf16 compute | fp8 tensorwise vs bf16 compute | for scale: float8 "
        "storage vs bf16 weights | input-gradient error, fp8 rowwise | fp8 tensorwise |")
    log("| --- | --- | --- | --- | --- | --- |")
    for storage, bf16_weights, eager, results in rows:
        r, t = results[fa.ROWWISE], results[fa.TENSORWISE]
        log(f"| {storage} | {relative(r[0], eager[0]):.2e} | {relative(t[0], eager[0]):.2e} | "
            f"{relative(eager[0], bf16_weights[0]):.2e} | {relative(r[1], eager[1]):.2e} | "
            f"{relative(t[1], eager[1]):.2e} |")
    log("")
    log("Errors are ||y - y_ref|| / ||y_ref|| over both streams' outputs (and over the gradient of <output, probe> "
        "with respect to the image-stream input, for a fixed random probe); the reference is the eager float8 path "
        "(bf16 compute on the same float8 weights). Weights N(0, 0.02), inputs N(0, 1).")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="training steps of each tiny run")
    parser.add_argument("--tokens", type=int, default=256, help="image tokens of the real-width block (a square)")
    parser.add_argument("--smoke", action="store_true", help="the block 256 wide (benchmarks/smoke.py: that it runs)")
    args = parser.parse_args(argv)
    from trainer_core.runs.cli import _quiet_libraries
    from trainer_core.models.float8.activations import scaling_for

    _quiet_libraries()
    log = lambda line="": print(line, flush=True)  # noqa: E731
    log(f"# float8 activations against bf16 compute (torch {torch.__version__}, CPU, {torch.get_num_threads()} "
        f"threads; this device's activation scaling: {scaling_for(torch.device('cpu'))})")
    log("")
    tiny_section(args.steps, log)
    block_section(args.tokens, log, heads=2 if args.smoke else 24)


if __name__ == "__main__":
    main()
