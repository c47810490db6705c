"""float8 block Linears without a bf16 weight copy: the frozen Linear's forward and input gradient compiled.

The eager path (`storage.FrozenLinearFunction`) upcasts each float8 weight to a bf16 copy per call: ~4 bytes
of memory traffic per weight value and call (planner.timeline.UPCAST_BYTES). Here the same autograd function
has compiled bodies (`CompiledFrozenLinearFunction`): forward y = (x W8^T) s + b (`frozen_linear_expression`),
backward grad_x = (grad_y s) W8 (`input_grad_expression`), each one graph in which the upcast is part of the
expression. On CUDA, Inductor can fuse it into the matmul's prologue (Triton templates, `prologue_fusion`, under
max-autotune), so the weight is read once, at 1 byte per value. Like the eager function it keeps nothing for
backward but the module, and reads the weight from it again there: backward memory is the eager path's, and
block streaming may move the weight between forward and backward, with or without checkpointing.

What is compiled, and why not more (each found when this path first ran, on the CPU):
- Not whole blocks (the first design). Every block's per-instance wrappers (peft's LoRA forwards, the
  modulation cache, these forwards) are Python objects Dynamo guards by identity, so each block compiled its
  own graph, and the ninth hit Dynamo's recompile limit (then ran eagerly, silently). The modulation cache's
  phase flag was guarded too, so a checkpoint recompute ran another graph than its forward, and
  `torch.utils.checkpoint` refused it (a different number of saved tensors). Lost: the fusion of the block's
  elementwise work, which is not what this path is for.
- Not the forward alone, differentiated by AOTAutograd: its partitioner saved the bf16 upcast of every weight
  for backward (what `tests/engine/test_float8_compiled.py` now checks against the eager path's saved bytes).
- Rows dynamic (`_as_rows`): with static shapes every new caption length compiled the text stream's Linears
  again, step after step.
So a model compiles one forward graph per weight shape and one backward graph per weight shape that passes a
gradient (the modulation Linears pass none): 4 + 3 for Qwen-Image (measured at real width), in its first
training step, whatever its depth, buckets and caption lengths; none after.

Status: ran on the CPU only (Inductor's C++ backend, torch 2.13, opt-in: `available(device, allow_cpu=True)`).
There, fp32 block outputs, losses and LoRA gradients equal the eager path's bit for bit, with and without
streaming and checkpointing (`tests/engine/test_float8_compiled.py`); two real-width blocks train a step in 0.76x
the eager time (Inductor's vectorised float8 conversion beats `Tensor.to`; the matmul is the same), after ~6 s
of compiling per process with Inductor's disk cache warm, ~22 s cold (`benchmarks/compiled_float8_cpu.py`,
figures in benchmarks/README.md). NOT run on CUDA (the
development machine has no GPU): `available()` gates it to CUDA + Triton on an Ampere or newer GPU, and
`benchmarks/gpu_speed_check.py` measures it there; the trainer takes it with `TrainConfig.compile_float8`
(off by default). On the CPU the trainer stays eager even then: compiling needs a C++
compiler at run time and costs more than the tiny models' whole runs (tests, the demo), and the CPU trains
no real model (it only rehearses one).
"""

from __future__ import annotations

import functools
import shutil

import torch
import torch.nn.functional as F
from torch import nn

from .storage import SCALE_BUFFER, restore_forwards, rotation_group

# Graphs per compiled expression: one per weight shape (4 in Qwen-Image's blocks), again for single rows, for
# another compute dtype, for inference mode (previews). Dynamo's default limit (8 per code object) would send
# the rest to the eager path without a word.
RECOMPILE_LIMIT = 64


def available(device: torch.device, allow_cpu: bool = False) -> bool:
    """torch.compile's Triton backend on an Ampere or newer CUDA GPU; with `allow_cpu`, also Inductor's C++
    backend on the CPU (a C++ compiler on the PATH). The CPU is opt-in: see the module docstring."""
    if device.type == "cpu":
        return allow_cpu and any(shutil.which(c) for c in ("g++", "c++", "clang++"))
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def frozen_linear_expression(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                             bias: torch.Tensor | None) -> torch.Tensor:
    """(rows, in) -> (rows, out): y = (x W^T) s + b, the stored weight (out, in) cast in the expression, the
    per-row scale s (out, 1) on the output (float8_scaled), the bias (out,). The forward torch.compile traces."""
    y = F.linear(x, weight.to(x.dtype))
    if scale is not None:
        y = y * scale.reshape(-1).to(x.dtype)
    return y if bias is None else y + bias.to(x.dtype)


def input_grad_expression(grad: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """(rows, out) -> (rows, in): grad_x = (grad_y s) W, the stored weight (out, in) cast in the expression.
    The backward torch.compile traces."""
    if scale is not None:
        grad = grad * scale.reshape(-1).to(grad.dtype)
    return grad @ weight.to(grad.dtype)


@functools.cache
def _compiled(expression, device_type: str):
    """`expression` compiled for one device type. Static shapes except the rows (`_as_rows`). `fullgraph`: a
    graph break in these few lines would be a bug, so it fails loudly. CUDA: max-autotune, which enables the
    Triton matmul templates the upcast fuses into; no CUDA graphs, because swapping changes the weights'
    storage between calls. CPU: the default mode (max-autotune's C++ GEMM templates only add compile time)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    mode = "max-autotune-no-cudagraphs" if device_type == "cuda" else None
    return torch.compile(expression, dynamic=False, fullgraph=True, mode=mode)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """(..., features) -> (rows, features), the row count marked dynamic: one graph per weight serves every
    row count (each image bucket, each caption length, any batch size, a (1, N, in) view into a longer tensor).
    Static rows would compile the text stream's Linears again for every new caption length, step after step.
    A single row (the modulation Linears at batch 1) stays its own, static graph: Dynamo specialises sizes 0
    and 1."""
    rows = t.reshape(-1, t.shape[-1])
    torch._dynamo.maybe_mark_dynamic(rows, 0)
    return rows


class CompiledFrozenLinearFunction(torch.autograd.Function):
    """`storage.FrozenLinearFunction` with compiled bodies: the forward and the input gradient are each one
    compiled graph (no autograd inside them), and like the eager function it saves nothing but the module and
    reads the weight from it again in backward. So the float8 weight is all backward keeps (AOTAutograd's own
    partitioner, given the forward to differentiate, saved the bf16 upcast instead: measured on the CPU), and
    block swapping may move the weight between forward and backward exactly as on the eager path."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
        ctx.linear = linear
        rows = _as_rows(x.detach())  # detached: grad mode is off in here anyway (one graph for both)
        y = _compiled(frozen_linear_expression, x.device.type)(
            rows, linear.weight, getattr(linear, SCALE_BUFFER, None), linear.bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        linear = ctx.linear
        compiled = _compiled(input_grad_expression, grad.device.type)
        grad_x = compiled(_as_rows(grad), linear.weight, getattr(linear, SCALE_BUFFER, None))
        return grad_x.reshape(*grad.shape[:-1], grad_x.shape[-1]), None


def compiled_frozen_forward(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The frozen Linear's forward through the compiled expressions. Their arguments are tensors, so the
    graphs do not depend on which Linear (or block) calls."""
    return CompiledFrozenLinearFunction.apply(x, linear)


def install(linears: list[nn.Linear]) -> dict[nn.Linear, object]:
    """Route these frozen Linears through `compiled_frozen_forward`; returns their previous forwards (for
    `uninstall`). A ConvRot-rotated int8 Linear keeps the eager path (its activations are rotated first)."""
    previous = {}
    for linear in linears:
        if rotation_group(linear):
            continue
        previous[linear] = linear.__dict__.get("forward")
        linear.forward = functools.partial(compiled_frozen_forward, linear)
    return previous


uninstall = restore_forwards  # the previous forwards `install` returned
