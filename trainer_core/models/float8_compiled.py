"""float8 block Linears without a bf16 weight copy in memory: each block compiled with torch.compile (CUDA).

The eager path (`float8.FrozenLinearFunction`) upcasts each float8 weight to a bf16 copy per call: ~4 bytes
of memory traffic per weight value and call (planner.timeline.UPCAST_BYTES). Compiled, the frozen Linear is
the plain expression y = (x W8^T) s + b (`compiled_frozen_forward`), which Inductor can fuse: the upcast
becomes the matmul's prologue (Triton templates, `prologue_fusion`, under max-autotune), so the weight is read
once, at 1 byte per value. Autograd's min-cut partitioner saves the float8 weight (a graph input, no copy)
for backward and recomputes the upcast there.

Status: written for CUDA and NOT run yet (the development machine has no GPU). `available()` gates it; the
eager path stays the fallback and the CPU path. `benchmarks/gpu_check.py` measures it against the eager path
(seconds per step, peak memory, loss on the same batches). One constraint, enforced by `BlockRunner`: with
block streaming it needs gradient checkpointing, because the saved float8 weight is a view of a ring slot
that a later copy overwrites; the checkpoint recompute saves it again right before the block's backward,
while its slot still holds it (swap_placement: a slot is refilled only after its owner's backward).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from .float8 import SCALE_BUFFER


def available(device: torch.device) -> bool:
    """torch.compile's Triton backend on an Ampere or newer CUDA GPU."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def compiled_frozen_forward(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """(..., in) -> (..., out): y = (x W^T) s + b with the stored weight cast in the expression (traceable)."""
    y = F.linear(x, linear.weight.to(x.dtype))
    scale = getattr(linear, SCALE_BUFFER, None)
    if scale is not None:
        y = y * scale.reshape(-1).to(x.dtype)
    return y if linear.bias is None else y + linear.bias.to(x.dtype)


def compile_block_forward(forward):
    """One compiled graph per block forward (all blocks share the code, so the cache holds one entry per
    input shape). No CUDA graphs: swapping changes the weights' storage between calls."""
    import torch._inductor.config as inductor_config

    if hasattr(inductor_config, "prologue_fusion"):
        inductor_config.prologue_fusion = True
    return torch.compile(forward, dynamic=False, mode="max-autotune-no-cudagraphs")


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
