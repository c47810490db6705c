"""int8 compute: the frozen block Linears multiply int8 activations by int8 weights (`TrainConfig.int8_compute`,
opt-in, off by default). The same arithmetic as ComfyUI's int8 ConvRot inference (comfy-kitchen's `int8_linear`:
activations quantised per token after the weight's Hadamard rotation), with backward kept in the compute dtype.

The weight, W (N, K), is held as ComfyUI's int8 files hold it (models/int8_convrot.py): q int8 (N, K), one fp32 scale
per output row sw (N, 1), and a rotation group g (0: not rotated), W = diag(sw) q H. An int8 ConvRot file's weights
are that already; a float8 or bf16 weight is rotated and quantised once, at load (`store_int8`). For x (..., K) with
M = x.numel() / K rows:

    xr = x H                                        (M, K)  x's dtype; x itself when g = 0
    sx = max_k |xr[m, k]| / 127                     (M, 1)  fp32, one scale per row (token)
    xq = round(xr / sx) clamped to +-127            (M, K)  int8
    acc = xq qᵀ                                     (M, N)  int32, exact (torch._int_mm)
    y  = acc * sx * swᵀ + b                         (M, N)  in fp32, rounded once to x's dtype

Backward (the input's gradient) is the eager path's (float8/storage.py `FrozenLinearFunction`, which this subclasses):
grad_x = ((grad_y sw) q) H in the compute dtype, q upcast from the module: the gradient that flows into the LoRA of
every earlier layer never sees an int8 rounding. Nothing is saved for backward but the module, so a streamed block's
weight is read again where it lies at backward, and checkpointing's recompute runs this forward again.

torch._int_mm's rules on CUDA: M > 16 and K, N multiples of 8. Linears whose K or N is not a multiple of 8 keep the
eager path (`qualifies`, applied on every device so the CPU tests the same choice); an input of 16 rows or fewer (the
modulation Linears read one row per sample) is padded with zero rows to 32 on CUDA and the padding dropped after.

The quantisation (`quantize_activation`: amax, divide, round, clamp, cast) and the rescale (`rescale`) are each compiled
on CUDA (torch.compile with Triton, `kernels_for`) into fused kernels instead of five eager ones each, so the path is
not bound by small kernels as the fp8 activations path is; elsewhere they run eagerly. Accuracy against bf16 compute:
benchmarks/README.md (`benchmarks/int8_compute_accuracy.py`). Memory: the plan counts the quantised input, its fp32
quotient, the rotated input and the int32/fp32 output as transients (planner/transients.py `int8_compute_bytes`).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from .float8.storage import (
    SCALE_BUFFER,
    FrozenLinearFunction,
    dequantized_weight,
    frozen_block_linears,
    install_frozen_compute,
    restore_forwards,
    rotation_group,
    set_rotation_group,
)
from .int8_convrot import DEFAULT_GROUP, hadamard, quantize

INT8_MAX = 127.0
ALIGN = 8  # torch._int_mm on CUDA: K and N multiples of 8
MIN_ROWS_CUDA = 17  # ... and more than 16 rows
PADDED_ROWS = 32
TINY = 1e-12  # smallest activation scale: an all-zero row quantises to zeros, not to NaN


def group_for(in_features: int) -> int:
    """The rotation group a weight of `in_features` inputs is quantised with: ComfyUI's default 256 where it divides
    in_features (every Qwen-Image block Linear), else the largest power of 4 below it that does; 0 where none does."""
    group = DEFAULT_GROUP
    while group >= 4:
        if in_features % group == 0:
            return group
        group //= 4
    return 0


@torch.no_grad()
def store_int8(transformer: nn.Module) -> int:
    """Hold every frozen block Linear's weight in the int8 layout, in place: one not int8 already (float8,
    float8_scaled, bf16, fp32) is dequantised, rotated with `group_for(in_features)` and quantised per output row, on
    the device it lies on, one Linear at a time. int8 weights (ComfyUI's files) stay as they are. Returns how many
    were converted."""
    converted = 0
    for _, linear in frozen_block_linears(transformer):
        if linear.weight.dtype == torch.int8:
            continue
        group = group_for(linear.in_features)
        q, scale = quantize(dequantized_weight(linear, torch.float32), group)
        linear.weight = nn.Parameter(q, requires_grad=False)
        if hasattr(linear, SCALE_BUFFER):
            delattr(linear, SCALE_BUFFER)
        linear.register_buffer(SCALE_BUFFER, scale)
        set_rotation_group(linear, group)
        install_frozen_compute(linear)
        converted += 1
    return converted


def qualifies(linear: nn.Linear) -> bool:
    """An int8-stored Linear whose shape torch._int_mm takes."""
    return (linear.weight.dtype == torch.int8 and linear.in_features % ALIGN == 0
            and linear.out_features % ALIGN == 0)


def quantize_activation(x2: torch.Tensor, h: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(xq, sx) with x2 H ~= xq * sx: x2 (M, K) -> xq (M, K) int8, sx (M, 1) fp32. `h`: the rotation (g, g) in x2's
    dtype (int8_convrot.hadamard), or None. A tensor argument, not a cached lookup, so torch.compile traces it plainly.

    The rotation runs in x2's dtype (exact H, one rounding, as int8_convrot.rotate); the quotient in fp32, rounded half
    to even. A NaN or inf in x2 makes its row's scale non-finite and the output NaN, which the non-finite step check
    catches."""
    if h is None:
        xr = x2
    else:
        m, k = x2.shape
        g = h.shape[0]
        xr = (x2.reshape(m, k // g, g) @ h).reshape(m, k)
    amax = torch.linalg.vector_norm(xr, ord=float("inf"), dim=1, keepdim=True, dtype=torch.float32)  # (M, 1)
    scale = (amax / INT8_MAX).clamp(min=TINY)
    return (xr / scale).round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def rescale(acc: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor, bias: torch.Tensor | None,
            dtype: torch.dtype) -> torch.Tensor:
    """The int32 product back to `dtype`: acc (M, N) int32 * sx (M, 1) * sw (1, N) (+ bias (N,)) in fp32, rounded once.
    In place on one fp32 copy: the eager transient is that copy (4 bytes per output value) beside the int32 product."""
    y = acc.float()
    y.mul_(sx).mul_(sw)
    if bias is not None:
        y.add_(bias.float())
    return y.to(dtype)


@functools.lru_cache(maxsize=None)
def kernels_for(device_type: str) -> tuple:
    """(quantize, rescale): `quantize_activation` and `rescale` compiled into fused kernels where that pays (CUDA with
    Triton: one pass over the input, one over the output, instead of five small kernels each); the eager functions
    elsewhere (the CPU, no Triton, or torch.compile failing to set up)."""
    eager = (quantize_activation, rescale)
    if device_type != "cuda":
        return eager
    try:
        from torch.utils._triton import has_triton
        if not has_triton():
            return eager
        return (torch.compile(quantize_activation, dynamic=True), torch.compile(rescale, dynamic=True))
    except Exception:  # noqa: BLE001  (any failure to set up the compiler keeps the eager kernels)
        return eager


EAGER_KERNELS = (quantize_activation, rescale)


def _scales(linear: nn.Linear) -> torch.Tensor:
    """The weight's per-row scales as a factor on the output's last dim: (1, N) fp32; (1, 1) for a tensor-wise one."""
    return getattr(linear, SCALE_BUFFER).reshape(1, -1).float()


def int8_linear(x2: torch.Tensor, linear: nn.Linear, kernels: tuple = EAGER_KERNELS) -> torch.Tensor:
    """(M, K) -> (M, N) in x2's dtype: y = (xq qᵀ) * sx * swᵀ + b with torch._int_mm (see the module docstring)."""
    quantize_fn, rescale_fn = kernels
    group = rotation_group(linear)
    xq, sx = quantize_fn(x2, hadamard(group, x2.dtype, x2.device) if group else None)
    rows = xq.shape[0]
    if xq.is_cuda and rows < MIN_ROWS_CUDA:
        xq = torch.cat([xq, xq.new_zeros(PADDED_ROWS - rows, xq.shape[1])])
    # q (N, K) row-major: its transpose is the column-major (K, N) second operand the kernels take, with no copy.
    acc = torch._int_mm(xq, linear.weight.t())[:rows]  # (M, N) int32, exact
    del xq
    return rescale_fn(acc, sx, _scales(linear), linear.bias, x2.dtype)


class Int8ComputeFunction(FrozenLinearFunction):
    """y = x Wᵀ + b computed in int8 (`int8_linear`); backward is `FrozenLinearFunction`'s (the compute dtype)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, linear: nn.Linear, kernels: tuple) -> torch.Tensor:
        ctx.linear = linear
        y = int8_linear(x.reshape(-1, linear.in_features), linear, kernels)  # (M, N)
        return y.reshape(*x.shape[:-1], linear.out_features)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        return *FrozenLinearFunction.backward(ctx, grad_out), None


def int8_forward(linear: nn.Linear, kernels: tuple, x: torch.Tensor) -> torch.Tensor:
    """The installed forward of one Linear."""
    return Int8ComputeFunction.apply(x, linear, kernels)


def install(linears: list[nn.Linear], device: torch.device) -> dict[nn.Linear, object]:
    """Route the qualifying Linears of `linears` through `int8_forward`; returns their previous forwards (for
    `uninstall`). Others (not int8, or shapes _int_mm refuses) keep theirs."""
    kernels = kernels_for(torch.device(device).type)
    previous = {}
    for linear in linears:
        if qualifies(linear):
            previous[linear] = linear.__dict__.get("forward")
            linear.forward = functools.partial(int8_forward, linear, kernels)
    return previous


uninstall = restore_forwards  # the previous forwards `install` returned


def status(installed: int, total: int) -> str:
    """One line for the run's status: whether int8 compute took effect, on how many Linears, and that it is opt-in."""
    if not installed:
        return (f"int8 compute: off (none of the {total} block Linears is held in int8 with in/out features "
                f"multiples of {ALIGN}); eager path")
    left = total - installed
    rest = f"; {left} keep the eager path (shapes not multiples of {ALIGN})" if left else ""
    return (f"int8 compute: on (experimental, opt-in until measured on a GPU), {installed} of {total} block Linears, "
            f"per-token activations, backward in the compute dtype{rest}")
