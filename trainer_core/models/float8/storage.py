"""Frozen block Linears stored in float8, int8 (or any dtype), computed in the activations' dtype.

Why a custom autograd function instead of `nn.Linear`: `F.linear` refuses mixed dtypes, and a plain
upcast inside `forward` would let autograd keep the upcast bf16 copy of every weight alive until
backward, which costs more memory than storing bf16 in the first place. `FrozenLinearFunction` upcasts
in forward, saves nothing but a reference to the module, and upcasts again in backward. Reading the
weight from the module at backward time is also what lets block swapping move weights in and out
between forward and backward. A weight that needs neither (stored in the activations' dtype, not streamed)
takes plain `F.linear` instead (`_frozen_forward`), which saves only a reference to it.

Storage modes:
- "float8": plain cast to `float8_e4m3fn` (values clamped to +-448).
- "float8_scaled": one fp32 scale per output row (row max / 448), so each row uses float8's whole range.
- "bfloat16"/"float32": no float8; the weight stays in that dtype.
A one-byte weight read from a file is kept as the file stores it under either float8 mode: float8 with its scale, or
ComfyUI's int8 (per-row `weight_scale`, optionally ConvRot-rotated: `ROTATION_GROUP` on the Linear, the maths in
models/int8_convrot.py). Its compute rotates the activations instead of the weight.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ...core.config import STORAGE_MODES  # re-exported: the allowed modes live in the config
from ..int8_convrot import dequantize as dequantize_int8
from ..int8_convrot import rotate
from ..qwen_arch import BLOCKS

FLOAT8 = torch.float8_e4m3fn
FLOAT8_MAX = float(torch.finfo(FLOAT8).max)  # 448.0
SCALE_BUFFER = "weight_scale"
# Set on a Linear whose int8 weight is ConvRot-rotated: the group size of its rotation (int8_convrot.py). A plain
# attribute, not a buffer: it is a fact of the stored weight, and moves with the module wherever the weight goes.
ROTATION_GROUP = "int8_rotation_group"


def frozen_linears(module: nn.Module, prefix: str = "") -> list[tuple[str, nn.Linear]]:
    """The frozen base Linears inside `module` (LoRA's own A/B layers excluded), in module order."""
    return [
        (name, m) for name, m in module.named_modules(prefix=prefix)
        if isinstance(m, nn.Linear) and "lora_" not in name
    ]


def frozen_block_linears(transformer: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The frozen base Linears of all `transformer_blocks`, named from the transformer."""
    return frozen_linears(transformer.transformer_blocks, prefix=BLOCKS)


def rotation_group(linear: nn.Module) -> int:
    """The ConvRot group of the Linear's stored int8 weight; 0 when it is not rotated."""
    return linear.__dict__.get(ROTATION_GROUP, 0)


def dequantized_weight(linear: nn.Linear, dtype: torch.dtype) -> torch.Tensor:
    """The weight in `dtype`, scaled back when stored as scaled float8 or int8, rotated back when ConvRot-rotated.
    Shape (out_features, in_features)."""
    group = rotation_group(linear)
    if group:
        return dequantize_int8(linear.weight, getattr(linear, SCALE_BUFFER), group).to(dtype)
    weight = linear.weight
    if weight.dtype != dtype:
        weight = weight.to(dtype)
    scale = getattr(linear, SCALE_BUFFER, None)
    if scale is not None:
        weight = weight * scale.to(dtype)
    return weight


def _weight_as(linear: nn.Linear, dtype: torch.dtype) -> torch.Tensor:
    """The stored weight (scales not applied) in `dtype`: (out_features, in_features)."""
    return linear.weight if linear.weight.dtype == dtype else linear.weight.to(dtype)


def _row_scale(linear: nn.Linear, dtype: torch.dtype) -> torch.Tensor | None:
    """float8_scaled's per-row scales as a factor on the output's last dim, (out,); None for other storage.

    A per-tensor scale (ComfyUI's scaled-fp8 text encoder, used once per prompt while caching) keeps being
    folded into the weight, so that encoder gives the same bits kept or dequantised at load. A rotated int8 weight's
    scale is always applied to the output (its weight is never formed)."""
    scale = getattr(linear, SCALE_BUFFER, None)
    if scale is None or (scale.numel() == 1 and not rotation_group(linear)):
        return None
    return scale.reshape(-1).to(dtype) if scale.numel() > 1 else scale.reshape(()).to(dtype)


class FrozenLinearFunction(torch.autograd.Function):
    """y = x W^T + b with W, b frozen; W is read from the module in forward and again in backward.

    float8_scaled blocks (W = diag(s) W8) scale the output instead of the weight: y = (x W8^T) s + b and
    grad_x = (grad_y s) W8, so no scaled weight-sized copy is made per call (a (rows, out) multiply instead of
    an (out, in) one; the upcast is the only weight-sized temporary). int8 weights with per-row scales take the same
    path; a ConvRot-rotated one (W = diag(s) q H) rotates the activations first, y = ((x H) q^T) s + b, and the
    input's gradient after, grad_x = ((grad_y s) q) H (H symmetric), so no weight-sized rotation is ever made."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
        ctx.linear = linear
        group = rotation_group(linear)
        if group:
            x = rotate(x, group)
        bias = linear.bias
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        scale = _row_scale(linear, x.dtype)
        if scale is None:
            return F.linear(x, dequantized_weight(linear, x.dtype), bias)
        y = F.linear(x, _weight_as(linear, x.dtype)) * scale
        return y if bias is None else y + bias

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        scale = _row_scale(ctx.linear, grad_out.dtype)
        if scale is None:
            return grad_out @ dequantized_weight(ctx.linear, grad_out.dtype), None
        grad_x = (grad_out * scale) @ _weight_as(ctx.linear, grad_out.dtype)
        group = rotation_group(ctx.linear)
        return (rotate(grad_x, group) if group else grad_x), None


# Set on a Linear whose weight storage changes between its forward and its backward (a streamed block's: the
# swapper points it at a GPU slot that the next blocks reuse). Such a weight must be read again at backward.
WEIGHT_MOVES = "frozen_weight_moves"


def _frozen_forward(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # Read through the module's own dicts: nn.Module's attribute lookup is a Python call, and this runs per Linear.
    params, weight_moves = linear._parameters, linear.__dict__.get(WEIGHT_MOVES)
    weight, bias = params["weight"], params["bias"]
    if (weight.dtype == x.dtype and (bias is None or bias.dtype == x.dtype)
            and SCALE_BUFFER not in linear._buffers and not weight_moves):
        # Stored in the activations' dtype and staying where it is (bf16 storage with bf16 compute, fp32 on the
        # CPU): plain F.linear, the same product. Its autograd keeps a reference to the weight, not a copy (the
        # same bytes as FrozenLinearFunction), and skips a Python autograd.Function per call, which costs a few
        # percent of a small model's step (benchmarks/README.md, step time).
        return F.linear(x, weight, bias)
    return FrozenLinearFunction.apply(x, linear)


def set_rotation_group(linear: nn.Linear, group: int) -> None:
    """Say that `linear`'s int8 weight is ConvRot-rotated with `group` (0: not rotated, or not int8)."""
    if group:
        linear.__dict__[ROTATION_GROUP] = group
    else:
        linear.__dict__.pop(ROTATION_GROUP, None)


def is_one_byte(weight: torch.Tensor) -> bool:
    """Whether a stored weight is one of the one-byte formats kept as they are (float8, int8)."""
    return weight.dtype in (FLOAT8, torch.int8)


def install_frozen_compute(linear: nn.Linear) -> None:
    """Route this Linear through `FrozenLinearFunction` (idempotent). Its weight must not require grad."""
    linear.weight.requires_grad_(False)
    if linear.bias is not None:
        linear.bias.requires_grad_(False)
    linear.forward = functools.partial(_frozen_forward, linear)


def mark_weight_moves(linear: nn.Linear, moves: bool) -> None:
    """Say whether `linear`'s weight may point elsewhere between its forward and backward (the swapper's blocks):
    then every call goes through `FrozenLinearFunction`, which reads the weight again at backward."""
    linear.__dict__[WEIGHT_MOVES] = moves


def quantize_weight(weight: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return (stored weight, per-row fp32 scale or None) for one (out, in) weight."""
    if mode == "float8":
        return weight.float().clamp(-FLOAT8_MAX, FLOAT8_MAX).to(FLOAT8), None
    if mode == "float8_scaled":
        w = weight.float()
        scale = (w.abs().amax(dim=1, keepdim=True) / FLOAT8_MAX).clamp(min=1e-12)  # (out, 1)
        return (w / scale).clamp(-FLOAT8_MAX, FLOAT8_MAX).to(FLOAT8), scale
    if mode in ("bfloat16", "float32"):
        return weight.to(getattr(torch, mode)), None
    raise ValueError(f"unknown storage mode {mode!r}; expected one of {STORAGE_MODES}")


@torch.no_grad()
def store_block_linears(transformer: nn.Module, mode: str) -> None:
    """Convert every frozen block Linear's weight to `mode` storage, one tensor at a time, in place.

    Biases stay in their dtype (they are tiny and precision-sensitive). Layers outside the blocks
    (`qwen_arch.OUTER_LINEARS`) and all norms are left alone. Safe to call on weights that are already stored this way.
    """
    for _, linear in frozen_block_linears(transformer):
        if is_one_byte(linear.weight) and mode.startswith("float8"):
            install_frozen_compute(linear)
            continue
        stored, scale = quantize_weight(dequantized_weight(linear, torch.float32), mode)
        set_rotation_group(linear, 0)
        linear.weight = nn.Parameter(stored, requires_grad=False)
        if scale is not None:
            linear.register_buffer(SCALE_BUFFER, scale.to(stored.device))
        elif hasattr(linear, SCALE_BUFFER):
            delattr(linear, SCALE_BUFFER)
        install_frozen_compute(linear)


def block_linear_bytes(transformer: nn.Module) -> int:
    """Bytes held by the frozen block Linears' weights, biases and scales."""
    total = 0
    for _, linear in frozen_block_linears(transformer):
        for t in (linear.weight, linear.bias, getattr(linear, SCALE_BUFFER, None)):
            if t is not None:
                total += t.numel() * t.element_size()
    return total


def quantize_per_tensor(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 weight, fp32 scalar scale) with weight ~= float8 * scale: ComfyUI's scaled-fp8 file format
    (one `scale_weight` per Linear, the tensor's max magnitude mapped to float8's 448)."""
    w = weight.float()
    scale = (w.abs().amax() / FLOAT8_MAX).clamp(min=1e-12)  # ()
    return (w / scale).clamp(-FLOAT8_MAX, FLOAT8_MAX).to(FLOAT8), scale


@torch.no_grad()
def dequantized_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of `module` in fp32, float8 Linear weights scaled back; LoRA layers left out.

    What file writers start from, whatever storage the module uses. Scale buffers are folded into
    their weights and not listed.
    """
    out = {name: p.detach().float() for name, p in module.named_parameters() if "lora_" not in name}
    for name, m in module.named_modules():
        if hasattr(m, SCALE_BUFFER) and "lora_" not in name:
            out[f"{name}.weight"] = dequantized_weight(m, torch.float32)
    return out


def restore_forwards(previous: dict[nn.Linear, object]) -> None:
    """Give Linears back the forwards an alternative float8 path (compiled, fp8 activations) replaced: the
    instance attribute it found, or none (the class's own forward)."""
    for linear, forward in previous.items():
        if forward is None:
            linear.__dict__.pop("forward", None)
        else:
            linear.forward = forward
