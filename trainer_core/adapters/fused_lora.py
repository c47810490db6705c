"""The LoRA of a frozen block Linear added in place into the base Linear's output, with A and B cast to the
compute dtype once per optimizer step instead of on every call (issue 51, item 4).

peft's LoRA Linear (0.21) computes `result = base(x) + lora_B(lora_A(dropout(x))) * scaling`: a matmul, a
multiply, an out-of-place add and, under bf16 compute with fp32 masters (`lora.compute_in_input_dtype`), two
casts of A and B per call. Here, for x (..., in), A (r, in), B (out, r), s = alpha / r:
    y = base(x)                                   (..., out)   the frozen Linear's own compute path, unchanged
    h = x A_c^T                                   (..., r)     A_c: A in x's dtype, cached
    y += s * h B_c^T                              in place: one addmm_ (`_AddLoraInPlace`), B_c cached likewise
The base output is saved by no base path's backward (F.linear, `storage.FrozenLinearFunction`, the float8 /
int8 alternatives: each keeps the module or its inputs), so writing into it is safe; the write bumps its version
counter, so autograd would refuse the backward if anything had saved it. The backward multiplies the output's
gradient by s first, then by B_c and h, in peft's order, so fp32 gradients are peft's.

The casts: A_c and B_c are kept on the layer, keyed on A's and B's `_version` counters (every in-place change,
an optimizer step, a `load_state_dict`, bumps them), the tensors' identity, the dtype and whether autograd
records, so a stale copy is never used. A copy made while autograd records stays in the graph (its backward
casts the gradient back to fp32), and is reused by every call until A or B change; where A already has the
compute dtype (fp32 on a CPU) no copy is made.

Only plain LoRA takes this path: one active adapter, dropout 0 (`nn.Identity`), no DoRA or other variant, not
merged, adapters enabled, and x in the dtype peft would compute in. The modulation Linears keep peft's forward
too: their base output may be a kept tensor (`streaming.modulation_outputs`), which must not be written into.
Everything else calls peft's own forward; LyCORIS layers (`lycoris.py`) are not touched.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..models.modulation import is_modulation_linear
from .lora import ADAPTER

_CACHE = "_fused_lora_casts"


class _AddLoraInPlace(torch.autograd.Function):
    """y += s * h B^T in place; y (..., out), h (..., r), B (out, r). Gradients: y's passes through; with
    g_s = s * g (..., out): h's = g_s B, B's = g_s^T h (peft's order of operations)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, h: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
        # Written through an alias, not `y` itself with `ctx.mark_dirty`: the base output is often a view made
        # inside the base's own autograd Function (F.linear's 3-D output in `FrozenLinearFunction`), which autograd
        # forbids marking dirty. The alias shares y's version counter, so a backward that had saved y (none of
        # ours does) would still raise instead of using the changed values.
        out = y.detach()
        out.view(-1, out.shape[-1]).addmm_(h.reshape(-1, h.shape[-1]), b.t(), alpha=scale)
        ctx.save_for_backward(h, b)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        h, b = ctx.saved_tensors
        grad_scaled = grad * ctx.scale
        grad_h = grad_scaled @ b if ctx.needs_input_grad[1] else None
        grad_b = None
        if ctx.needs_input_grad[2]:
            grad_b = grad_scaled.reshape(-1, grad.shape[-1]).t() @ h.reshape(-1, h.shape[-1])
        return grad, grad_h, grad_b, None


def _cast(layer: nn.Module, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B in `dtype`: themselves where they have it, else the copies kept since they last changed."""
    if a.dtype == dtype and b.dtype == dtype:
        return a, b
    key = (a._version, b._version, id(a), id(b), a.data_ptr(), b.data_ptr(), dtype, torch.is_grad_enabled())
    kept = layer.__dict__.get(_CACHE)
    if kept is None or kept[0] != key:
        kept = (key, a.to(dtype), b.to(dtype))
        layer.__dict__[_CACHE] = kept
    return kept[1], kept[2]


def _takes_fused_path(layer: nn.Module, x: torch.Tensor, args, kwargs) -> bool:
    if args or kwargs or layer.disable_adapters or layer.merged or list(layer.active_adapters) != [ADAPTER]:
        return False
    if ADAPTER in layer.lora_variant or not isinstance(layer.lora_dropout[ADAPTER], nn.Identity):
        return False
    if layer.lora_A[ADAPTER].bias is not None or layer.lora_B[ADAPTER].bias is not None:  # peft's lora_bias
        return False
    # With `cast_input_dtype_enabled` (lora.compute_in_input_dtype off) peft casts x to A's dtype: its path does that.
    return not (layer.cast_input_dtype_enabled and layer.lora_A[ADAPTER].weight.dtype != x.dtype)


def fused_forward(layer: nn.Module, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """The layer's forward (see the module docstring); peft's own where this path does not apply."""
    if not _takes_fused_path(layer, x, args, kwargs):
        return type(layer).forward(layer, x, *args, **kwargs)
    y = layer.base_layer(x)
    if not y.is_contiguous():  # written through a 2-D view below; a copy is ours to write into
        y = y.contiguous()
    if y.dtype != x.dtype:  # a base that computes in another dtype: peft's path, which casts the sum back
        return type(layer).forward(layer, x)
    a_c, b_c = _cast(layer, layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight, x.dtype)
    h = torch.nn.functional.linear(x, a_c)  # (..., r)
    return _AddLoraInPlace.apply(y, h, b_c, float(layer.scaling[ADAPTER]))


def install(blocks: nn.Module) -> list[nn.Module]:
    """Put `fused_forward` on every peft LoRA Linear in `blocks` (the transformer's block list) except the
    modulation Linears; the layers it went on (give them to `uninstall`)."""
    from peft.tuners.lora import Linear as LoraLinear

    layers = []
    for block in blocks:
        for name, module in block.named_modules():  # names inside the block: 'attn.to_q', 'img_mod.1'
            if type(module) is LoraLinear and not is_modulation_linear(name):
                module.forward = functools.partial(fused_forward, module)
                layers.append(module)
    return layers


def uninstall(layers: list[nn.Module]) -> None:
    """peft's forward back on `layers`, their kept casts dropped."""
    for layer in layers:
        layer.__dict__.pop("forward", None)
        layer.__dict__.pop(_CACHE, None)
