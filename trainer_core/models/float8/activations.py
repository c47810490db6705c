"""float8 activations: frozen float8 block Linears multiplied in float8 by `torch._scaled_mm` (the
`fp8_activations` training option, off by default).

The eager path (`storage.FrozenLinearFunction`) upcasts the float8 weight to a bf16 copy on every call and
multiplies in bf16. Here the activation is quantised instead and both operands enter the matmul in float8
(twice the tensor-core rate of bf16 on Ada, Hopper and Blackwell; no weight-sized copy). For x (..., K)
in bfloat16 and a stored weight W8 (N, K) float8_e4m3fn, with M = x.numel() / K rows:

    rowwise:     sx = max_k |x[m, k]| / 448              (M, 1) fp32, one scale per row (token)
                 y  = _scaled_mm(q(x / sx), W8^T, scale_a=sx, scale_b=sw, bias=b)          (M, N) bf16
    tensorwise:  sx = max |x| / 448                     () fp32, one scale for the whole tensor
                 y  = _scaled_mm(q(x / sx), W8^T, scale_a=sx, scale_b=1) * sw + b

with q = round to float8_e4m3fn and sw the weight's scale: float8_scaled's per-output-row scales (1, N), or
1 for plain float8. So y = (q(x / sx) sx) (W8 sw)^T + b, accumulated in fp32 and rounded once to bf16
(`tests/engine/test_float8_activations.py` checks exactly this). W8^T is a view of the row-major stored weight:
the column-major second operand `_scaled_mm` wants, with no copy.

Why rowwise where the device has it: a token with large activations sets only its own scale, so the other
tokens keep float8's normal range instead of sinking toward its subnormals (float8's relative precision is
the same everywhere above 2^-6 x scale; a per-tensor scale pushes the small tokens below that), and the
float8_scaled weight's row scales ride in the same kernel's epilogue (scale_b) instead of a pass over the
output. Not every build has rowwise kernels for every GPU, so `scaling_for(device)` tries rowwise, then
tensorwise, once per device on a small problem, and returns None where neither runs (a GPU without float8
tensor cores: the eager path then stays). Figures for both: benchmarks/README.md (`fp8_activations_quality.py`).

Backward stays the eager path's (this function subclasses `FrozenLinearFunction`): grad_x = grad_y W in the
compute dtype, W upcast again from the module, no weight gradient (the weight is frozen). Why not float8
there too: gradients span a far wider range than activations (e5m2 has 2 mantissa bits) and need scaling
histories to be safe; the LoRA's weight gradients come from these input gradients, block after block,
so an error made there lands in every update. Keeping backward in bf16 limits float8's error to the
forward's values (the same kind of error float8 weight storage already makes) and keeps training as stable
as the eager path's.

Memory: the quantisation's transient is an fp32 quotient plus the float8 result, 5 bytes per input value, where the
eager path's is a bf16 copy of the weight; the memory plan does not count the difference (benchmarks/README.md).

Which Linears: the frozen block Linears stored in float8 whose in and out features are multiples of 16
(`_scaled_mm`'s rule on CUDA, applied on every device so the CPU tests the same choice); all Qwen-Image block
Linears qualify. Others keep the eager forward. At call time an input that is not bfloat16 (fp32 compute, the
CPU default) also takes the eager path: `_scaled_mm`'s rowwise kernels only write bfloat16.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from .storage import FLOAT8, FLOAT8_MAX, SCALE_BUFFER, FrozenLinearFunction, restore_forwards

ROWWISE, TENSORWISE = "rowwise", "tensorwise"
SCALINGS = (ROWWISE, TENSORWISE)  # in order of preference
COMPUTE_DTYPE = torch.bfloat16  # the only activation dtype that takes the float8 path
ALIGN = 16  # _scaled_mm on CUDA: both dims of the weight multiples of 16
TINY = 1e-12  # smallest activation scale: an all-zero row quantises to zeros, not to NaN


def qualifies(linear: nn.Linear) -> bool:
    """A float8-stored Linear whose shape `_scaled_mm` takes."""
    return (linear.weight.dtype == FLOAT8 and linear.in_features % ALIGN == 0
            and linear.out_features % ALIGN == 0)


def quantize_activation(x2: torch.Tensor, scaling: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(x8, sx) with x2 ~= x8 * sx: x2 (M, K) -> x8 (M, K) float8_e4m3fn and fp32 scales (M, 1) or ().

    The largest magnitude (of each row, or of the tensor) maps to float8's 448. A NaN or inf in x2 makes its
    scale non-finite and the output NaN, which the trainer's non-finite step check then catches."""
    rows = scaling == ROWWISE
    amax = torch.linalg.vector_norm(x2, ord=float("inf"), dim=1 if rows else None, keepdim=rows,
                                    dtype=torch.float32)  # (M, 1) or ()
    scale = (amax / FLOAT8_MAX).clamp(min=TINY)
    # Divided by a (M, 1) or (1, 1) fp32 tensor the bf16 x2 promotes to fp32 (a 0-dim divisor would not: the
    # quotient would be rounded to bf16 first), so each value is rounded once, to float8.
    return (x2 / scale.reshape(-1, 1)).to(FLOAT8), scale


def _weight_scale(linear: nn.Linear) -> torch.Tensor | None:
    """float8_scaled's per-output-row scales as (1, N) fp32, a per-tensor scale as (1, 1); None without."""
    scale = getattr(linear, SCALE_BUFFER, None)
    return None if scale is None else scale.reshape(1, -1).float()


def scaled_linear(x2: torch.Tensor, linear: nn.Linear, scaling: str) -> torch.Tensor:
    """(M, K) bf16 -> (M, N) bf16: y = (q(x2 / sx) sx) (W8 sw)^T + b, with `_scaled_mm`."""
    x8, sx = quantize_activation(x2, scaling)
    w8t = linear.weight.t()  # (K, N), column-major: a view of the stored (N, K) weight
    bias = linear.bias
    if bias is not None and bias.dtype != x2.dtype:
        bias = bias.to(x2.dtype)
    sw = _weight_scale(linear)
    if scaling == ROWWISE:
        n = linear.out_features
        sw = torch.ones(1, n, device=x2.device) if sw is None else sw.expand(1, n).contiguous()
        return torch._scaled_mm(x8, w8t, scale_a=sx, scale_b=sw, bias=bias, out_dtype=x2.dtype)
    one = torch.ones((), device=x2.device)
    if sw is None:
        return torch._scaled_mm(x8, w8t, scale_a=sx, scale_b=one, bias=bias, out_dtype=x2.dtype)
    y = torch._scaled_mm(x8, w8t, scale_a=sx, scale_b=one, out_dtype=x2.dtype) * sw.to(x2.dtype)
    return y if bias is None else y + bias


class Fp8ActivationFunction(FrozenLinearFunction):
    """y = x W^T + b computed in float8 (`scaled_linear`); backward is `FrozenLinearFunction`'s (bf16)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, linear: nn.Linear, scaling: str) -> torch.Tensor:
        ctx.linear = linear
        x2 = x.reshape(-1, linear.in_features)  # (M, K)
        y = scaled_linear(x2, linear, scaling)  # (M, N)
        return y.reshape(*x.shape[:-1], linear.out_features)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        return *FrozenLinearFunction.backward(ctx, grad_out), None


def fp8_forward(linear: nn.Linear, eager, scaling: str, x: torch.Tensor) -> torch.Tensor:
    """The installed forward: float8 for bfloat16 inputs, the eager forward for any other."""
    if x.dtype != COMPUTE_DTYPE:
        return eager(x)
    return Fp8ActivationFunction.apply(x, linear, scaling)


@functools.lru_cache(maxsize=None)
def _probe(device: str) -> str | None:
    """The first of SCALINGS whose `_scaled_mm` runs on `device` and gives the dequantised product (a 32 x 32
    Linear on 16 rows), or None."""
    g = torch.Generator().manual_seed(0)
    linear = nn.Linear(32, 32, dtype=COMPUTE_DTYPE)
    with torch.no_grad():
        linear.weight = nn.Parameter(torch.randn(32, 32, generator=g).to(FLOAT8), requires_grad=False)
        linear.bias.copy_(torch.randn(32, generator=g))
    linear.register_buffer(SCALE_BUFFER, torch.rand(32, 1, generator=g) + 0.5)
    linear.to(device)
    x = torch.randn(16, 32, generator=g).to(device, COMPUTE_DTYPE)
    for scaling in SCALINGS:
        try:
            y = scaled_linear(x, linear, scaling).float()
        except (RuntimeError, NotImplementedError):
            continue
        x8, sx = quantize_activation(x, scaling)
        reference = (x8.float() * sx) @ (linear.weight.float() * linear.weight_scale).t() + linear.bias.float()
        if torch.allclose(y, reference, rtol=2e-2, atol=2e-2):
            return scaling
    return None


def scaling_for(device: torch.device) -> str | None:
    """ROWWISE, TENSORWISE, or None (no `_scaled_mm` on this device: keep the eager path). Probed once per device."""
    return _probe(str(torch.device(device)))


def install(linears: list[nn.Linear], scaling: str) -> dict[nn.Linear, object]:
    """Route the qualifying Linears of `linears` through `fp8_forward`; returns their previous forwards (for
    `uninstall`). Linears that do not qualify are left as they are."""
    previous = {}
    for linear in linears:
        if qualifies(linear):
            eager = linear.__dict__.get("forward")
            previous[linear] = eager
            linear.forward = functools.partial(fp8_forward, linear, eager or linear.forward, scaling)
    return previous


uninstall = restore_forwards  # the previous forwards `install` returned


def status(installed: int, total: int, scaling: str | None, storage_float8: bool) -> str:
    """One line for the run's status: whether the option took effect, and how."""
    if not storage_float8:
        return "fp8 activations: off (the block weights are not stored in float8)"
    if scaling is None:
        return "fp8 activations: off (this device runs no float8 matmul: torch._scaled_mm failed; eager float8 path)"
    left = total - installed
    rest = f"; {left} keep the eager path (shapes not multiples of {ALIGN})" if left else ""
    return (f"fp8 activations: on, {scaling} activation scales, {installed} of {total} block Linears "
            f"(bfloat16 compute only){rest}")
