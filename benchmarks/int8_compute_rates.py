"""Per-kernel rates of int8 compute (`models/int8_compute.py`) at a training step's Linear shapes: torch._int_mm against
the bf16 matmul of the same shape, and the quantise and rescale kernels around it (`kernels_for`: compiled on CUDA).

    python benchmarks/int8_compute_rates.py            # CUDA: Qwen-Image's block Linears at 1024², 256 text tokens
    python benchmarks/int8_compute_rates.py --tiny     # CPU, small shapes, the same code

`int8_gemm_rates(env, shapes)` is the function a device check's profile phase calls (benchmarks/harness.Env; shapes as
`step_shapes` gives them). Its rows feed the timeline's int8 rate (planner/gpus.py `int8_tops`, a data-sheet peak until
measured) and a projection for other cards.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer_core.models import int8_compute as ic  # noqa: E402
from trainer_core.models.int8_convrot import hadamard  # noqa: E402


def step_shapes(width: int = 1024, height: int = 1024, text_tokens: int = 256, arch=None) -> list[tuple[str, int, int, int]]:
    """(name, rows M, in K, out N) of every distinct block Linear call of one training forward (planner/transients.py's
    rows per Linear), Qwen-Image's real architecture by default."""
    from trainer_core.planner import PlanInputs
    from trainer_core.planner.arch import real_arch
    from trainer_core.planner.transients import block_linear_rows

    arch = arch or real_arch()
    p = PlanInputs(width=width, height=height, text_tokens=text_tokens)
    seen, out = set(), []
    for s, rows in block_linear_rows(arch, p, arch.image_tokens(width, height)):
        key = (rows, s.in_features, s.out_features)
        if key not in seen:
            seen.add(key)
            out.append((s.name, *key))
    return out


def _timed(fn, device: torch.device, repeats: int) -> float:
    """Seconds per call of `fn` (after one warm-up call), CUDA events on a GPU, wall time on the CPU."""
    fn()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3 / repeats
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats


def int8_gemm_rates(env, shapes, repeats: int | None = None) -> list[dict]:
    """One row per (name, M, K, N) of `shapes` on `env.device`: the int8 GEMM's TOPS (torch._int_mm, int8 x int8 ->
    int32, the weight's transpose as int8 compute passes it), the bf16 GEMM's TFLOPS, their ratio, and the fused
    quantise (rotation + amax + cast) and rescale kernels' microseconds. M <= 16 is padded as int8_linear pads it."""
    device = env.device
    repeats = repeats or (20 if device.type == "cuda" else 2)
    quantize_fn, rescale_fn = ic.kernels_for(device.type)
    rows = []
    for name, m, k, n in shapes:
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(m, k, generator=g).to(device, torch.bfloat16)
        w = torch.randn(n, k, generator=g).to(device, torch.bfloat16)
        xq = torch.randint(-127, 128, (max(m, ic.PADDED_ROWS if device.type == "cuda" and m < ic.MIN_ROWS_CUDA
                                           else m), k), generator=g, dtype=torch.int8).to(device)
        wq = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8).to(device)
        h = hadamard(256, torch.bfloat16, device) if k % 256 == 0 else None
        sx, sw = torch.rand(m, 1, device=device), torch.rand(1, n, device=device)
        bias = torch.randn(n, generator=g).to(device, torch.bfloat16)
        acc = torch._int_mm(xq, wq.t())[:m]
        int8_s = _timed(lambda: torch._int_mm(xq, wq.t()), device, repeats)
        bf16_s = _timed(lambda: x @ w.t(), device, repeats)
        quant_s = _timed(lambda: quantize_fn(x, h), device, repeats)
        rescale_s = _timed(lambda: rescale_fn(acc, sx, sw, bias, torch.bfloat16), device, repeats)
        ops = 2 * m * k * n
        rows.append(dict(linear=name, m=m, k=k, n=n, int8_tops=round(ops / int8_s / 1e12, 2),
                         bf16_tflops=round(ops / bf16_s / 1e12, 2), int8_over_bf16=round(bf16_s / int8_s, 2),
                         quantize_us=round(quant_s * 1e6, 1), rescale_us=round(rescale_s * 1e6, 1),
                         int8_path_over_bf16=round(bf16_s / (int8_s + quant_s + rescale_s), 2)))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, small shapes (the dry run)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    env = argparse.Namespace(device=torch.device("cuda" if cuda else "cpu"))
    shapes = step_shapes() if cuda else [(n, max(1, m // 16), k // 16, nn // 16) for n, m, k, nn in step_shapes(256, 256, 64)]
    rows = int8_gemm_rates(env, shapes)
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("| " + " | ".join("---" for _ in keys) + " |")
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
