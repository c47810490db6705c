"""CPU measurements for issue 3 (fit 1024 x 1024 training into 16 GB), printed and written to
benchmarks/results_cpu.md and benchmarks/results_cpu.json.

    make bench            # or: .venv/bin/python benchmarks/memory_cpu.py [--quick]

1. float8 / bf16 bytes of the block Linears (`float8.block_linear_bytes`): tiny model, one real-width block.
2. Output error of float8 and float8_scaled storage against bf16 storage of the same weights: one
   real-width block (weights normal, std 0.02) and the tiny model.
3. 8-bit AdamW state / AdamW state after one step on the LoRA of one real-width block (rank 32,
   attention+mlp), by `optim.optimizer_state_bytes`.
4. The planner at 1024 x 1024, rank 32: the swap count for 24, 16 and 12 GiB, with its table.
5. The planner's per-block activation terms against a real-width block measured on the CPU.
6. Our Trainer's step time / a bare diffusers + peft loop's (goal <= 1.05), and k chunks of n/k steps /
   one call of n steps (goal <= 1.02); `speed.py` says how. A cProfile of our steps goes with them.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import platform
import time
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)

import torch

OUT = Path(__file__).resolve().parent


def section(title: str, log) -> None:
    log("")
    log(f"## {title}")
    log("")


def float8_bytes_and_error(log, quick: bool) -> dict:
    from trainer_core.devtools.random_weights import random_transformer
    from trainer_core.families.qwen_image import build_tiny_components
    from trainer_core.models.float8 import block_linear_bytes, store_block_linears

    result = {}
    # Tiny model (the test config), float32 compute as in the demo.
    tiny = {mode: build_tiny_components(seed=0, storage=mode).transformer for mode in ("float8", "float8_scaled", "bfloat16")}
    tiny_bytes = {mode: block_linear_bytes(t) for mode, t in tiny.items()}
    g = torch.Generator().manual_seed(0)
    x, text = torch.randn(1, 16, 16, generator=g), torch.randn(1, 7, 16, generator=g)

    def run_tiny(t):
        with torch.no_grad():
            return t(hidden_states=x, encoder_hidden_states=text, timestep=torch.tensor([0.6]),
                     img_shapes=[[(1, 4, 4)]], return_dict=False)[0]

    ref = run_tiny(tiny["bfloat16"])
    tiny_err = {mode: float((run_tiny(tiny[mode]) - ref).norm() / ref.norm()) for mode in ("float8", "float8_scaled")}

    # One real-width block: the same random weights stored three ways.
    t0 = time.perf_counter()
    real = {"bfloat16": random_transformer(dict(num_layers=1), storage="bfloat16", seed=0, std=0.02)}
    for mode in ("float8", "float8_scaled"):
        real[mode] = copy.deepcopy(real["bfloat16"])
        store_block_linears(real[mode], mode)
    real_bytes = {mode: block_linear_bytes(t) for mode, t in real.items()}
    block = lambda t: t.transformer_blocks[0]  # noqa: E731
    grid, n_txt = (8, 8) if quick else (16, 16), 16
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, grid[0] * grid[1], 3072, generator=g).bfloat16()  # (B, N_img, D)
    prompt = torch.randn(1, n_txt, 3072, generator=g).bfloat16()  # (B, N_txt, D)
    temb = torch.randn(1, 3072, generator=g).bfloat16()
    rope = real["bfloat16"].pos_embed([(1, *grid)], max_txt_seq_len=n_txt, device=torch.device("cpu"))
    outs = {}
    with torch.no_grad():
        for mode, t in real.items():
            txt_out, img_out = block(t)(hidden, prompt, None, temb, rope)
            outs[mode] = torch.cat([txt_out, img_out], dim=1).float()
    real_err = {mode: float((outs[mode] - outs["bfloat16"]).norm() / outs["bfloat16"].norm())
                for mode in ("float8", "float8_scaled")}
    seconds = time.perf_counter() - t0

    log("| model | float8 / bf16 bytes | float8_scaled / bf16 bytes | rel. output error float8 | float8_scaled |")
    log("| --- | --- | --- | --- | --- |")
    for name, b, e in (("tiny (2 blocks, D=32)", tiny_bytes, tiny_err), ("one real-width block (D=3072)", real_bytes, real_err)):
        log(f"| {name} | {b['float8'] / b['bfloat16']:.4f} | {b['float8_scaled'] / b['bfloat16']:.4f} | "
            f"{e['float8']:.2e} | {e['float8_scaled']:.2e} |")
    log("")
    log(f"Bytes are `block_linear_bytes` (weights + bf16 biases + scales). Real block: {real_bytes['bfloat16']:,d} B "
        f"bf16, {real_bytes['float8']:,d} B float8, {real_bytes['float8_scaled']:,d} B float8_scaled. Error: "
        f"||y - y_bf16|| / ||y_bf16|| over both streams' outputs, {grid[0] * grid[1]} image + {n_txt} text tokens, "
        f"weights N(0, 0.02), inputs N(0, 1), bf16 compute ({seconds:.0f} s).")
    result.update(tiny_bytes=tiny_bytes, tiny_error=tiny_err, real_block_bytes=real_bytes, real_block_error=real_err)
    return result


def optimizer_states(log) -> dict:
    from trainer_core.core.config import OptimizerConfig
    from trainer_core.planner import real_arch
    from trainer_core.training.optim import build_optimizer, optimizer_state_bytes

    arch = real_arch()
    shapes = []
    for block, fan_in, fan_out in ((b, arch.linear(m).in_features, arch.linear(m).out_features)
                                   for b, m in arch.lora_targets["attention+mlp"] if b == 0):
        shapes += [(32, fan_in), (fan_out, 32)]
    result = {}
    for name in ("adamw8bit", "adamw"):
        params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
        opt = build_optimizer(params, OptimizerConfig(optimizer=name))
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
        result[name] = optimizer_state_bytes(opt)
    numel = sum(a * b for a, b in shapes)
    log(f"LoRA of one real-width block, rank 32, attention+mlp: {len(shapes)} tensors, {numel:,d} parameters (fp32).")
    log("")
    log("| optimizer | state bytes | bytes / parameter |")
    log("| --- | --- | --- |")
    for name, b in result.items():
        log(f"| {name} | {b:,d} | {b / numel:.3f} |")
    log("")
    log(f"8-bit / 32-bit state: **{result['adamw8bit'] / result['adamw']:.4f}**")
    result["ratio"] = result["adamw8bit"] / result["adamw"]
    result["params"] = numel
    return result


def planner_tables(log) -> dict:
    from trainer_core.planner import GIB, PlanInputs, auto_blocks_to_swap, render_budget_table, render_choice

    inputs = PlanInputs(width=1024, height=1024, rank=32)
    log("```")
    log("$ python -m trainer_core plan --resolution 1024 --rank 32 --budget-gb {24,16,12}")
    log(render_budget_table(inputs, [24, 16, 12]))
    log("```")
    result = {}
    for budget in (24, 16, 12):
        choice = auto_blocks_to_swap(inputs, budget * GIB)
        result[budget] = dict(blocks_to_swap=choice.blocks_to_swap, gpu_gib=choice.plan.gpu_total / GIB,
                              host_training_gib=choice.plan.host_training_total / GIB)
        log("")
        log(f"<details><summary>{budget} GiB: full table</summary>")
        log("")
        log("```")
        log(render_choice(choice))
        log("```")
        log("</details>")
    return result


def real_width_activations(log, quick: bool) -> dict:
    """The planner's per-block terms against one real-width block measured with `memprobe`."""
    from trainer_core.core.config import LoraConfig
    from trainer_core.devtools.memprobe import probe_block
    from trainer_core.devtools.random_weights import random_transformer
    from trainer_core.adapters.lora import inject_lora
    from trainer_core.planner.activations import ActivationSettings, block_saved_bytes, block_working_bytes
    from trainer_core.planner.arch import arch_from_transformer

    # Two blocks so block 0 has all its targets; bf16 storage: the working term excludes the upcast.
    model = random_transformer(dict(num_layers=2), storage="bfloat16")
    params = inject_lora(model, LoraConfig(rank=32, alpha=32.0, targets="attention+mlp"), seed=0)
    with torch.no_grad():
        for p in params:
            p.normal_(0, 0.01)
    model.train()
    arch = arch_from_transformer(model)
    grid, n_txt = ((8, 8), 16) if quick else ((32, 32), 64)  # full run: 1024 x 1024's 16:1 token ratio
    n_img = grid[0] * grid[1]
    # The block's own LoRA gradients: the plan counts them in its gradient term (blocks >= i at the peak).
    grads = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                if ".lora_" in n and n.startswith("transformer_blocks.0."))
    rows = []
    for ckpt in (True, False):
        t = time.perf_counter()
        probe = probe_block(model, 1, grid, n_txt, checkpointing=ckpt)
        s = ActivationSettings(preset="attention+mlp", rank=32, lora_bytes=4, dropout=False, cuda=False,
                               checkpointing=ckpt)
        saved = block_saved_bytes(arch, s, 1, n_img, n_txt)
        working = block_working_bytes(arch, s, 1, n_img, n_txt)
        rows.append(dict(checkpointing=ckpt, measured_saved=probe.saved_bytes, planned_saved=saved,
                         measured_peak=probe.peak_bytes, planned_peak=saved + working,
                         seconds=time.perf_counter() - t))
    log(f"One real-width block (D=3072, F=12288, 24 heads), LoRA rank 32 attention+mlp fp32, bf16 compute, "
        f"{n_img} image + {n_txt} text tokens, inputs requiring grad:")
    log("")
    log("Peak: planned = saved + working. On top of it the plan also counts this block's LoRA gradients "
        f"({grads:,d} B) in its gradient term; in the measured peak they are (mostly) not yet allocated, so "
        "the whole plan is on the safe side by up to that amount.")
    log("")
    log("| checkpointing | saved: measured | saved: planned | peak: measured | peak: planned | planned / measured |")
    log("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        log(f"| {r['checkpointing']} | {r['measured_saved']:,d} | {r['planned_saved']:,d} | {r['measured_peak']:,d} | "
            f"{r['planned_peak']:,d} | {r['planned_peak'] / r['measured_peak']:.3f} |")
    log("")
    log("Saved bytes come from the exact formula. The working ratio was measured on a 4-head block at 4096 + "
        "256 tokens (`tools/calibrate_activations.py`); this checks that it carries over to the real 24 heads "
        "and to another token count. (At 64 + 16 tokens, `--quick`, per-block constants dominate and the "
        "comparison says little.)")
    return dict(rows=rows, block_lora_grad_bytes=grads)


def speed(log, quick: bool, smoke: bool = False) -> dict:
    import speed as speed_mod

    log(f"Model: `{speed_mod.MODEL}` (D=512, F=2048, ~9M parameters per block), float32 weights and compute, "
        f"{speed_mod.TEXT_TOKENS} text tokens, LoRA rank {speed_mod.RANK} {speed_mod.TARGETS}, AdamW8bit, batch 1, "
        "no checkpointing, no swapping. Two image sizes: at 256 tokens per-call Python costs weigh more than "
        "they ever do at 1024 x 1024 (4096 tokens at D=3072); 1024 tokens is closer to the real balance.")
    # (latents, pairs, steps per run, chunk pairs, steps of a chunked run)
    sizes = [((32, 32), 6, 2, 4, 8)] if quick else [((32, 32), 42, 2, 20, 12), ((64, 64), 18, 1, 8, 8)]
    results = []
    for latent_hw, pairs, steps, chunk_pairs, chunk_steps in sizes[:1] if smoke else sizes:
        lines = []
        sized = (dict(speed_mod.SMOKE) if smoke else dict(pairs=pairs, steps=steps, chunk_pairs=chunk_pairs,
                                                          chunk_steps=chunk_steps, latent_hw=latent_hw))
        r = speed_mod.measure(**sized, log=lines.append)
        latent_hw = r.latent_hw
        results.append(r)
        log("")
        log(f"Latents {latent_hw} ({latent_hw[0] * latent_hw[1] // 4} image tokens):")
        log("")
        log("```")
        for line in lines:
            log(line)
        log("```")
    log("")
    log("| image tokens | measure | ours (median) | reference (median) | median of pair ratios | other estimate | goal |")
    log("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        tokens = r.latent_hw[0] * r.latent_hw[1] // 4
        log(f"| {tokens} | step time vs bare diffusers + peft | {r.ours_step_s * 1e3:.1f} ms | "
            f"{r.bare_step_s * 1e3:.1f} ms | **{r.ratio:.3f}** | fastest runs: {r.ratio_of_fastest:.3f} | <= 1.05 |")
        log(f"| {tokens} | {r.chunks} chunks of {r.steps // r.chunks} vs 1 call of {r.steps} steps | "
            f"{r.chunked_s:.3f} s | {r.whole_s:.3f} s | **{r.chunk_ratio:.3f}** | from train(0) "
            f"({r.call_overhead_s * 1e6:.0f} us/call): {r.chunk_ratio_bound:.4f} | <= 1.02 |")
    ab = speed_mod.forward_backward_ab(**(dict(rounds=1, calls=1, instances=1, latent_hw=(8, 8),
                                               config=speed_mod.SMOKE_MODEL) if smoke else {}))
    log("")
    log("Where a difference would come from: one forward + backward only (no data, no optimizer), same weights, "
        "256 image tokens, 2 instances of each, median ms over rotating rounds:")
    log("")
    log("| model | ms | / bare |")
    log("| --- | --- | --- |")
    for name, ms in ab.items():
        log(f"| {name} | {ms:.2f} | {ms / ab['bare']:.3f} |")
    profile = speed_mod.profile_ours(**(dict(steps=1, top=3, warmup=1, config=speed_mod.SMOKE_MODEL) if smoke else dict(steps=10, top=18)))
    log("")
    log("<details><summary>cProfile of 10 of our steps at 256 image tokens (cumulative)</summary>")
    log("")
    log("```")
    for line in profile.strip().splitlines():
        log(line.replace(str(common.REPO) + "/", "").rstrip())
    log("```")
    log("</details>")
    return dict(forward_backward_ms=ab, runs=[dict(image_tokens=r.latent_hw[0] * r.latent_hw[1] // 4, **{
        k: v for k, v in dataclasses.asdict(r).items() if k != "latent_hw"}) for r in results])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (a smoke run)")
    parser.add_argument("--out", default=str(OUT / "results_cpu"), help="path without extension for .md and .json")
    parser.add_argument("--only", nargs="*", default=None,
                        help="sections to run: float8 optimizer planner activations speed")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds (benchmarks/smoke.py): the sections without a real-width block or a planner "
                        "search (optimizer, speed), speed at its smoke sizes; the figures mean nothing")
    args = parser.parse_args()
    if args.smoke and args.only is None:
        args.only = ["optimizer", "speed"]

    from trainer_core.runs.cli import _quiet_libraries

    _quiet_libraries()
    lines: list[str] = []

    def log(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    log("# CPU benchmark results")
    log("")
    log(f"`.venv/bin/python benchmarks/memory_cpu.py{' --quick' if args.quick else ''}` on {platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}.")
    results = {}
    sections = [
        ("float8", "float8 storage: bytes and output error", lambda: float8_bytes_and_error(log, args.quick)),
        ("optimizer", "8-bit AdamW state", lambda: optimizer_states(log)),
        ("planner", "Planner: 1024 x 1024, rank 32 (attention+mlp, fp32 LoRA, AdamW8bit, checkpointing)",
         lambda: planner_tables(log)),
        ("activations", "Planner activation terms against a real-width block", lambda: real_width_activations(log, args.quick)),
        ("speed", "Trainer overhead and chunking", lambda: speed(log, args.quick, args.smoke)),
    ]
    for key, title, fn in sections:
        if args.only is not None and key not in args.only:
            continue
        section(title, log)
        t = time.perf_counter()
        results[key] = fn()
        log("")
        log(f"_({time.perf_counter() - t:.0f} s)_")
    out = Path(args.out)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nwrote {out.with_suffix('.md')} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
