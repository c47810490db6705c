"""The profile phase of the device check (issue 51, item 1): where a Qwen-Image step's time goes on this card.

    .venv/bin/python benchmarks/gpu_profile.py            # CUDA: real shapes, a few minutes
    .venv/bin/python benchmarks/gpu_profile.py --tiny     # CPU, tiny shapes: the same code path in seconds
    bash benchmarks/device_check.sh --only profile        # the same phase inside the device check's report

`run_profile(env, report, clock, share)` fills three tables of a `harness.Report`:
- card: the card's clocks, power and temperature as nvidia-smi reads them (where it is installed; never changed);
- kernel rates: each small piece of a step alone, median of timed repeats (CUDA events; the host clock after a
  synchronize on the CPU): the step's matmul shapes in bf16, the float8 -> bf16 upcast of a weight, every
  attention backend forward + backward without and with a mask, QK RMSNorm + RoPE as diffusers does it against
  ours (eager, compiled), and the LoRA's add (peft's out of place against an in-place addmm_);
- profiled steps: one forward + backward per variant (diffusers' block, ours eager, ours compiled) of a real-width
  model of a few blocks, float8 storage, bf16 compute, peft's LoRA, no checkpointing: s/step, kernels launched
  (the profiler's device kernels on a GPU, dispatched operators on the CPU), host syncs (torch's sync debug mode),
  and the top kernels by time.
Figures only (the checks: each piece ran and the variants' losses agree); the timeline model reads them later.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)
import harness

import torch
import torch.nn.functional as F

from trainer_core.models import attention_backend, fused_block

CARD_COLUMNS = ["query", "value"]
RATE_COLUMNS = ["piece", "shape", "dtype", "variant", "ms", "rate", "note"]
STEP_COLUMNS = ["variant", "blocks", "seconds_per_step", "kernels", "host_syncs", "loss", "top_kernels"]
SMI_FIELDS = ["clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem", "power.draw", "power.limit",
              "temperature.gpu", "clocks_throttle_reasons.active"]
# Real: 1024x1024 (4096 image tokens) and 256 text tokens, width 3072, 24 heads of 128, LoRA rank 32.
REAL = dict(image=4096, text=256, width=3072, heads=24, mlp=12288, rank=32, blocks=3, repeats=20)
TINY = dict(image=64, text=8, width=64, heads=2, mlp=256, rank=4, blocks=2, repeats=3)


def card_table(report: harness.Report) -> None:
    """nvidia-smi's clocks and power (a query only: the card's settings stay as they are)."""
    rows = report.table("card", CARD_COLUMNS)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        rows.append({"query": "nvidia-smi", "value": "not installed here"})
        return
    try:
        out = subprocess.run([smi, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        rows.append({"query": "nvidia-smi", "value": f"failed: {e}"})
        return
    values = out[0].split(", ") if out else []
    rows += [{"query": f, "value": v} for f, v in zip(SMI_FIELDS, values)]


def timed_ms(env: harness.Env, fn, repeats: int) -> float:
    """The median milliseconds of `fn()` over `repeats` calls after two warm-ups (compiling, handles)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if env.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def _rate(env, rows, piece, shape, dtype, variant, fn, repeats, flops=None, bytes_=None, note="") -> float | None:
    try:
        ms = timed_ms(env, fn, repeats)
    except Exception as e:  # a backend this card or build lacks is a row, not the phase's end
        rows.append({"piece": piece, "shape": shape, "dtype": dtype, "variant": variant, "ms": None, "rate": None,
                     "note": f"{type(e).__name__}: {e}"[:160]})
        return None
    rate = (f"{flops / ms / 1e9:.3g} TFLOP/s" if flops else f"{bytes_ / ms / 1e6:.3g} GB/s" if bytes_ else None)
    rows.append({"piece": piece, "shape": shape, "dtype": dtype, "variant": variant, "ms": round(ms, 4),
                 "rate": rate, "note": note})
    return ms


def kernel_rates(env: harness.Env, report: harness.Report, size: dict) -> None:
    rows = report.table("kernel rates", RATE_COLUMNS)
    dev, bf16, n = env.device, torch.bfloat16, size["repeats"]
    tokens, width, mlp = size["image"] + size["text"], size["width"], size["mlp"]
    g = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, dtype=bf16, grad=False):
        return torch.randn(shape, generator=g, device=dev).to(dtype).requires_grad_(grad)

    # The step's matmul shapes (the image stream's; the text stream's are the same at 256 rows).
    for name, k, m in (("q/k/v/out", width, width), ("mlp up", width, mlp), ("mlp down", mlp, width),
                       ("modulation", width, 6 * width)):
        rows_ = 1 if name == "modulation" else tokens
        x, w = rand(rows_, k), rand(m, k)
        _rate(env, rows, "matmul", f"({rows_},{k})x({k},{m})", "bf16", name, lambda: F.linear(x, w), n,
              flops=2 * rows_ * k * m)
    # The float8 storage's upcast of one MLP weight.
    w8 = rand(mlp, width).to(torch.float8_e4m3fn)
    _rate(env, rows, "float8 upcast", f"({mlp},{width})", "float8_e4m3fn->bf16", "w.to(bf16)",
          lambda: w8.to(bf16), n, bytes_=3 * mlp * width)
    # Attention, every backend, forward + backward, without and with a mask (one padded text token).
    heads, dh = size["heads"], width // size["heads"]
    q, k, v = (rand(1, tokens, heads, dh, grad=True) for _ in range(3))
    mask = torch.ones(1, 1, 1, tokens, dtype=torch.bool, device=dev)
    mask[..., size["text"] - 1] = False
    packages = attention_backend.installed_packages()
    backends = [attention_backend.SDPA, attention_backend.MATH] + (
        [attention_backend.FLASH, attention_backend.CUDNN, attention_backend.EFFICIENT] if env.cuda else []) + [
        b for b in (attention_backend.FA3, attention_backend.FA2) if env.cuda and b in packages]
    attn_flops = 3 * 4 * tokens * tokens * heads * dh  # forward 4 S^2 H Dh, backward about twice that
    for backend in backends:
        for masked in (False, True):
            if masked and backend in (attention_backend.FA3, attention_backend.FA2):
                continue  # the packages take no mask (attention_backend.attend sends masked calls to SDPA)

            def step(backend=backend, m=mask if masked else None):
                attention_backend.attend(q, k, v, m, backend).sum().backward()

            _rate(env, rows, "attention fwd+bwd", f"(1,{tokens},{heads},{dh})", "bf16",
                  f"{backend}{' masked' if masked else ''}", step, n, flops=attn_flops)
    # QK RMSNorm + RoPE of one joint query: diffusers' modules against ours.
    rmsnorm_rope_rates(env, rows, size, rand, n)
    # The LoRA's add on one q projection: peft's out of place against an in-place addmm_.
    rank = size["rank"]
    x, base, a, b = rand(tokens, width), rand(tokens, width), rand(rank, width), rand(width, rank)
    _rate(env, rows, "LoRA add", f"({tokens},{width}) rank {rank}", "bf16", "peft: y + B(A x) s",
          lambda: base + F.linear(F.linear(x, a), b) * 1.0, n, flops=4 * tokens * width * rank)
    _rate(env, rows, "LoRA add", f"({tokens},{width}) rank {rank}", "bf16", "in place: addmm_",
          lambda: base.clone().addmm_(F.linear(x, a), b.t()), n, flops=4 * tokens * width * rank,
          note="includes the clone of the base output")


def rmsnorm_rope_rates(env, rows, size, rand, n) -> None:
    from diffusers.models.normalization import RMSNorm
    from diffusers.models.transformers.transformer_qwenimage import QwenEmbedRope, apply_rotary_emb_qwen

    heads, dh, image, text = size["heads"], size["width"] // size["heads"], size["image"], size["text"]
    side = int(image ** 0.5)
    axes = [16, 56, 56] if dh == 128 else [dh // 4, dh * 3 // 8, dh * 3 // 8]
    img_freqs, txt_freqs = QwenEmbedRope(theta=10000, axes_dim=axes, scale_rope=True)(
        [[(1, side, side)]], max_txt_seq_len=text, device=env.device)
    norm_i, norm_t = (RMSNorm(dh, eps=1e-6).to(env.device, torch.bfloat16) for _ in range(2))
    xi, xt = rand(1, side * side, heads, dh, grad=True), rand(1, text, heads, dh, grad=True)

    def theirs():
        out = torch.cat([apply_rotary_emb_qwen(norm_t(xt), txt_freqs, use_real=False),
                         apply_rotary_emb_qwen(norm_i(xi), img_freqs, use_real=False)], dim=1)
        out.sum().backward()

    tables = [*fused_block.rope_tables(txt_freqs), *fused_block.rope_tables(img_freqs)]
    shape = f"(1,{side * side}+{text},{heads},{dh})"
    bytes_ = 2 * 2 * (side * side + text) * heads * dh * 2  # read + write, forward + backward, bf16
    _rate(env, rows, "RMSNorm+RoPE fwd+bwd", shape, "bf16", "diffusers", theirs, n, bytes_=bytes_)
    variants = [("ours eager", fused_block.EAGER_OPS)]
    if fused_block.compile_available(env.device):
        variants.append(("ours compiled", fused_block.compiled_ops()))
    for label, ops in variants:
        def ours(ops=ops):
            ops.joint_norm_rope(xt, xi, norm_t.weight, norm_i.weight, 1e-6, 1e-6, *tables).sum().backward()

        _rate(env, rows, "RMSNorm+RoPE fwd+bwd", shape, "bf16", label, ours, n, bytes_=bytes_)


# ---------------------------------------------------------------------------------------------- profiled steps
def few_block_model(env: harness.Env, size: dict):
    """A real-width Qwen-Image transformer of `size['blocks']` blocks (tiny on the CPU): random float8 block
    weights, bf16 compute, the pack's LoRA (attention + MLP, its rank) in the compute dtype."""
    from trainer_core.adapters.lora import compute_in_input_dtype, inject_lora
    from trainer_core.core.config import LoraConfig
    from trainer_core.devtools.random_weights import random_transformer

    config = dict(num_layers=size["blocks"])
    if not env.cuda:
        config.update(num_attention_heads=size["heads"], attention_head_dim=size["width"] // size["heads"],
                      axes_dims_rope=(8, 12, 12), joint_attention_dim=32)
    model = random_transformer(config, storage="float8", compute_dtype=torch.bfloat16, device=env.device, seed=0)
    inject_lora(model, LoraConfig(rank=size["rank"], alpha=float(size["rank"])), seed=0)
    compute_in_input_dtype(model)
    with torch.no_grad():  # B away from zero: the LoRA's backward does its real work
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.01)
    return model


def step_inputs(env: harness.Env, model, size: dict) -> dict:
    g = torch.Generator(device=env.device).manual_seed(1)
    side = int(size["image"] ** 0.5)
    cfg = model.config
    return dict(
        hidden_states=torch.randn(1, side * side, cfg.in_channels, generator=g, device=env.device).bfloat16(),
        encoder_hidden_states=torch.randn(1, size["text"], cfg.joint_attention_dim, generator=g,
                                          device=env.device).bfloat16(),
        encoder_hidden_states_mask=None, timestep=torch.full((1,), 0.5, device=env.device),
        img_shapes=[[(1, side, side)]], return_dict=False)


def one_step(model, inputs) -> torch.Tensor:
    out = model(**inputs)[0]
    loss = out.float().pow(2).mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return loss.detach()


def profiled_step(env: harness.Env, model, inputs) -> dict:
    """s/step (median of 3 after warm-ups), kernels and host syncs of one step, its top kernels."""
    from torch.profiler import ProfilerActivity, profile

    loss = one_step(model, inputs)  # warm-up: compiling, tables, handles
    seconds = timed_ms(env, lambda: one_step(model, inputs), 3) / 1000
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if env.cuda else [])
    with profile(activities=activities) as prof:
        one_step(model, inputs)
        if env.cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    if env.cuda:
        kernels = sum(e.count for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
                      and e.self_device_time_total > 0)
        top = sorted((e for e in events if e.self_device_time_total > 0), key=lambda e: -e.self_device_time_total)
        top_text = "; ".join(f"{e.key[:48]} {e.self_device_time_total / 1000:.1f} ms x{e.count}" for e in top[:5])
    else:
        import op_count

        kernels = sum(1 for e in prof.events() if op_count._counted(e.name) and not _nested(e))
        top = sorted(events, key=lambda e: -e.self_cpu_time_total)
        top_text = "; ".join(f"{e.key[:48]} {e.self_cpu_time_total / 1000:.1f} ms x{e.count}" for e in top[:5])
    return dict(seconds_per_step=round(seconds, 4), kernels=kernels, host_syncs=host_syncs(env, model, inputs),
                loss=float(loss), top_kernels=top_text)


def _nested(event) -> bool:
    import op_count

    parent = event.cpu_parent
    while parent is not None:
        if op_count._counted(parent.name):
            return True
        parent = parent.cpu_parent
    return False


def host_syncs(env: harness.Env, model, inputs) -> int | None:
    """Synchronising calls in one step, as torch's sync debug mode warns of them (CUDA only: None on the CPU)."""
    if not env.cuda:
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            one_step(model, inputs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum(1 for w in caught if "synchroniz" in str(w.message).lower())


def profiled_steps(env: harness.Env, report: harness.Report, size: dict, clock) -> None:
    rows = report.table("profiled steps", STEP_COLUMNS)
    model = few_block_model(env, size)
    inputs = step_inputs(env, model, size)
    variants = [("diffusers", fused_block.OFF), ("fused eager", fused_block.EAGER)]
    if fused_block.compile_available(env.device):
        variants.append(("fused compiled", fused_block.COMPILED))
    else:
        report.skip("profile: fused compiled step", "torch.compile needs a CUDA GPU with Triton here")
    choice = attention_backend.choose_for(attention_backend.AUTO, env.device)
    report.note(f"profile: {choice.status}; steps without checkpointing, all blocks resident")
    for label, mode in variants:
        if not clock.enough(5 if env.tiny else 30):
            report.cut_phase(f"profile: {label} step", f"{clock.left():.0f} s left")
            continue
        installed = fused_block.install(model.transformer_blocks, mode, choice, env.device)
        try:
            rows.append({"variant": label, "blocks": size["blocks"], **profiled_step(env, model, inputs)})
        finally:
            installed.uninstall()
        print(f"  {label}: {rows[-1]['seconds_per_step']} s/step, {rows[-1]['kernels']} kernels", flush=True)
    base = rows[0]["loss"] if rows else None
    for r in rows[1:]:
        rel = abs(r["loss"] - base) / abs(base)
        report.check(f"profile: {r['variant']} step's loss against diffusers'", rel <= 1e-2,
                     f"relative difference {rel:.2e} (limit 1e-2, bf16)")


def run_profile(env: harness.Env, report: harness.Report, clock: harness.Clock, share: float | None = None) -> None:
    """The profile phase into `report` (see the module docstring); `share`: its seconds (None: no limit)."""
    size = REAL if env.cuda else TINY
    phase = harness.Clock(share if share is not None else (clock.left() if clock.end is not None else None))
    card_table(report)
    kernel_rates(env, report, size)
    report.check("profile: every kernel rate measured", all(
        r["ms"] is not None or r["variant"] in (attention_backend.CUDNN, attention_backend.EFFICIENT)
        or "masked" in r["variant"] for r in report.tables["kernel rates"]["rows"]),
        "failures are listed in the note column")
    profiled_steps(env, report, size, phase)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(parser, str(Path(__file__).resolve().parent / "gpu_profile_out"))
    args = parser.parse_args(argv)
    env = harness.make_env(args, "gpu_profile.py")
    clock = harness.Clock(args.seconds)
    report = harness.Report(f"Profile ({'tiny, CPU' if env.tiny else 'real width'})", env,
                            "benchmarks/gpu_profile.py" + (" --tiny" if env.tiny else ""))
    run_profile(env, report, clock, args.seconds)
    return 0 if report.write(args.out, "gpu_profile").startswith("VERDICT: PASS") else 1


if __name__ == "__main__":
    sys.exit(main())
