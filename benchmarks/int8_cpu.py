"""One real-width Qwen-Image block's frozen Linears on the CPU: int8 ConvRot storage against float8.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/int8_cpu.py int8 4      # A: 4 forward + backward passes
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/int8_cpu.py float8 4    # B
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/int8_cpu.py int8 0      # the setup alone (and float8 0)

The block's 14 Linears at the real widths (planner.arch.real_arch: 3072 wide, MLP 12288; 340M weights), each called
through the frozen compute path (`models.float8.FrozenLinearFunction`) as training calls it: the image stream's on 256
rows, the text stream's on 64, the modulation Linears on 1, in bf16, forward then backward to the input. 'int8': each
weight as ComfyUI's int8 ConvRot file holds it (models/int8_convrot.py, group 256: the input rotated per call, the
int8 weight upcast); 'float8': float8 with one scale per row (the float8_scaled storage). Random codes and scales
(the cost does not depend on the values). A block's cost: (median of N passes - median of 0 passes) / N, each arm
with its own setup, whole processes run in turn.
"""

import sys

import common  # noqa: F401  (puts the repository on sys.path)

import torch
from torch import nn

from trainer_core.models.qwen_arch import IMG_STREAM, MODULATION_LINEARS
from trainer_core.models.streaming import assign_frozen_linear_weight
from trainer_core.planner.arch import real_arch

IMAGE_ROWS, TEXT_ROWS = 256, 64


def linears(storage: str, smoke: bool = False) -> list[tuple[nn.Linear, int]]:
    """(Linear, rows of its input) for each of a real block's frozen Linears, stored as `storage`; `smoke`: the
    smallest one only (benchmarks/smoke.py: that it runs)."""
    torch.manual_seed(0)
    image_side = set(IMG_STREAM.values())
    out = []
    shapes = real_arch().block_linears
    for shape in [min(shapes, key=lambda s: s.in_features * s.out_features)] if smoke else shapes:
        size, rows_scale = (shape.out_features, shape.in_features), torch.rand(shape.out_features, 1) * 1e-3
        linear = nn.Linear(shape.in_features, shape.out_features, device="meta")
        linear.bias = nn.Parameter(torch.zeros(shape.out_features), requires_grad=False)
        if storage == "int8":  # random codes: the compute's cost does not depend on the values
            assign_frozen_linear_weight(linear, torch.randint(-127, 128, size, dtype=torch.int8), rows_scale, 256)
        else:
            assign_frozen_linear_weight(linear, torch.randn(size).to(torch.float8_e4m3fn), rows_scale)
        rows = 1 if shape.name in MODULATION_LINEARS else IMAGE_ROWS if shape.name in image_side else TEXT_ROWS
        out.append((linear, rows))
    return out


def main(storage: str, passes: int, smoke: bool = False) -> None:
    torch.set_grad_enabled(True)
    built = linears(storage, smoke)
    for _ in range(passes):
        for linear, rows in built:
            x = torch.randn(rows, linear.in_features, dtype=torch.bfloat16, requires_grad=True)
            linear(x).sum().backward()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), smoke="--smoke" in sys.argv[3:])
