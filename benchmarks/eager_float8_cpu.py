"""The eager float8_scaled Linear on the CPU: output scaling (now) against weight scaling (before issue 10).

    OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python benchmarks/eager_float8_cpu.py output   # A
    OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python benchmarks/eager_float8_cpu.py weight   # B

Run A and B in turn (A B A B ..., 5 pairs) and take the median of the pairs' cpu-time ratios: pairing keeps the
ratio meaningful while the machine's speed drifts.

One real-width `img_mlp.net.0.proj` (3072 -> 12288, float8 with per-row scales), 64 tokens in bf16, 10 forward +
backward calls. 'output': `FrozenLinearFunction` as it is, y = (x W8^T) s + b. 'weight': the same function
with the weight scaled per call, s W8 (the expression the function used before), so the A/B isolates the
scaling. Few tokens on purpose: the weight-sized work is what differs.
"""

import sys

import common  # noqa: F401  (puts the repository on sys.path)

import torch
import torch.nn.functional as F
from torch import nn

from trainer_core.models.float8 import SCALE_BUFFER, FrozenLinearFunction, dequantized_weight, quantize_weight


class WeightScaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, linear):
        ctx.linear = linear
        return F.linear(x, dequantized_weight(linear, x.dtype), linear.bias.to(x.dtype))

    @staticmethod
    def backward(ctx, grad):
        return grad @ dequantized_weight(ctx.linear, grad.dtype), None


def main(mode: str, smoke: bool = False) -> None:
    """`smoke`: a 256 x 1024 Linear, one pass (benchmarks/smoke.py: that it runs)."""
    torch.manual_seed(0)
    width = 256 if smoke else 3072
    lin = nn.Linear(width, 4 * width)
    stored, scale = quantize_weight(lin.weight.data, "float8_scaled")
    lin.weight = nn.Parameter(stored, requires_grad=False)
    lin.bias.requires_grad_(False)
    lin.register_buffer(SCALE_BUFFER, scale)
    fn = FrozenLinearFunction if mode == "output" else WeightScaled
    x = torch.randn(64, width, dtype=torch.bfloat16, requires_grad=True)
    for _ in range(1 if smoke else 10):
        fn.apply(x, lin).sum().backward()


if __name__ == "__main__":
    main(sys.argv[1], smoke="--smoke" in sys.argv[2:])
