"""float8 block Linears without a bf16 weight copy: the frozen Linear's expression compiled with torch.compile.

The eager path (`float8.FrozenLinearFunction`) upcasts each float8 weight to a bf16 copy per call: ~4 bytes
of memory traffic per weight value and call (planner.timeline.UPCAST_BYTES). Compiled, the frozen Linear is
the plain expression y = (x W8^T) s + b (`frozen_linear_expression`), which Inductor can fuse on CUDA: the
upcast becomes the matmul's prologue (Triton templates, `prologue_fusion`, under max-autotune), so the weight
is read once, at 1 byte per value. AOTAutograd's min-cut partitioner saves the float8 weight (a graph input, no
copy) for backward and recomputes the upcast there, as `FrozenLinearFunction` does by hand.

What is compiled: one function of tensors, (x, W8, s, b) -> y, shared by every frozen block Linear; not the
block. Compiling whole blocks was the first design and never worked (found when it first ran, on the CPU):
every block's per-instance wrappers (peft's LoRA forwards, the modulation cache, these forwards) are Python
objects that Dynamo guards by identity, so each block compiled its own graph and the eighth hit Dynamo's
recompile limit (then eager, silently); and the modulation cache makes a checkpoint recompute run a different
graph from the forward, which `torch.utils.checkpoint` refuses (a different number of saved tensors). A function
of tensors has none of that: its graphs depend only on shapes, dtypes, which of s and b exist and whether x
needs a gradient, so a model compiles a fixed handful of graphs (`graphs_per_model`) whatever its depth, in
its first training step, and none after (`tests/test_float8_compiled.py` counts them). Lost against block
compilation: the fusion of the block's elementwise work, which is not what this path is for.

Status: ran on the CPU only (Inductor's C++ backend, opt-in `available(device, allow_cpu=True)`): outputs,
losses and LoRA gradients match the eager path, with streaming and checkpointing, with no recompilation after
the first step. NOT run on CUDA (the development machine has no GPU): `available()` gates it to CUDA + Triton
on an Ampere or newer GPU; `benchmarks/gpu_speed_check.py` measures it there. On the CPU it is off by default:
the CPU has no fused float8 matmul (Inductor computes the upcast weight and hands it to the same GEMM), so
there is nothing to win, and compiling costs tens of seconds (`benchmarks/compiled_float8_cpu.py` measures both).

One constraint, enforced by `offload.BlockRunner`: with block streaming it needs gradient checkpointing. The
compiled backward reads the float8 weight it saved in forward; for a streamed block that is a view of a ring
slot that a later copy overwrites. The checkpoint recompute saves it again right before the block's backward,
while its slot still holds it (swap_placement: a slot is refilled only after its owner's backward).
"""

from __future__ import annotations

import functools
import shutil

import torch
import torch.nn.functional as F
from torch import nn

from .float8 import SCALE_BUFFER

# Graphs one model may need: per distinct (x shape, weight shape) pair (Qwen-Image: 3 image-stream and 3
# text-stream shapes, 1 modulation), whether x needs a gradient (block 0's first Linears: no), training or
# not (previews). Dynamo's default limit (8 per code object) would send the rest to eager without a word.
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
    """(..., in) -> (..., out): y = (x W^T) s + b, the stored weight (out, in) cast in the expression, the
    per-row scale s (out, 1) on the output (float8_scaled), the bias (out,). The forward torch.compile traces."""
    y = F.linear(x, weight.to(x.dtype))
    if scale is not None:
        y = y * scale.reshape(-1).to(x.dtype)
    return y if bias is None else y + bias.to(x.dtype)


def input_grad_expression(grad: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """(..., out) -> (..., in): grad_x = (grad_y s) W, the stored weight cast in the expression. The backward
    torch.compile traces."""
    if scale is not None:
        grad = grad * scale.reshape(-1).to(grad.dtype)
    return grad @ weight.to(grad.dtype)


@functools.cache
def _compiled(expression, device_type: str):
    """`expression` compiled for one device type. Static shapes except the rows (`_as_rows`); `fullgraph`: a graph break in these few lines would be a bug, so it fails loudly. CUDA: max-autotune,
    which enables the Triton matmul templates the upcast fuses into; no CUDA graphs, because swapping changes
    the weights' storage between calls. CPU: the default mode (max-autotune's C++ GEMM templates only add
    compile time here)."""
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
    """`float8.FrozenLinearFunction` with compiled bodies: the forward and the input gradient are each one
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
    `uninstall`)."""
    previous = {}
    for linear in linears:
        previous[linear] = linear.__dict__.get("forward")
        linear.forward = functools.partial(compiled_frozen_forward, linear)
    return previous


def uninstall(previous: dict[nn.Linear, object]) -> None:
    for linear, forward in previous.items():
        if forward is None:
            linear.__dict__.pop("forward", None)
        else:
            linear.forward = forward
