"""Cheap checks that tensors hold only finite numbers (no NaN, no inf).

Used wherever weights are adopted or kept: a LoRA file to continue from, the LoRA after each optimizer
step, a checkpoint before it is written and before it is resumed. Nothing non-finite is ever written or
adopted (README, troubleshooting).

The check is one fused norm per device and dtype group and a single host sync: NaN and inf propagate
through squares and sums, so a finite total norm proves every element finite. Only when the total is
not finite (a NaN or inf somewhere, or finite values so large that their norm overflows) is each tensor
checked on its own, which names the culprits and rules out the overflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch


def _floating(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    # Integer and bool tensors (RNG states, 8-bit quantised optimizer state) cannot be non-finite.
    return [t.detach() for t in tensors if t.is_floating_point() and t.numel()]


@torch.no_grad()
def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """True when every element of every floating-point tensor is finite (one host sync when it is)."""
    tensors = _floating(tensors)
    if not tensors:
        return True
    if _total_norm_finite(tensors):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)  # rare: find out for sure


@torch.no_grad()
def nonfinite_names(named: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors in `named` that hold a NaN or inf (in `named`'s order)."""
    floating = {k: t.detach() for k, t in named.items() if t.is_floating_point() and t.numel()}
    if not floating or _total_norm_finite(list(floating.values())):
        return []
    return [k for k, t in floating.items() if not bool(torch.isfinite(t).all())]


def _total_norm_finite(tensors: list[torch.Tensor]) -> bool:
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        # float8 has no norm kernels: look at it as the float32 it stands for (float8 tensors are small here).
        t = t.float() if t.element_size() == 1 else t
        groups.setdefault((t.device, t.dtype), []).append(t)
    totals = []
    for group in groups.values():
        try:
            norms = torch._foreach_norm(group)  # one fused kernel launch per group
        except (AttributeError, RuntimeError, NotImplementedError):
            norms = [torch.linalg.vector_norm(t) for t in group]
        totals.append(torch.stack([n.float() for n in norms]).sum().cpu())
    return bool(torch.isfinite(torch.stack(totals).sum()))


@torch.no_grad()
def has_nonfinite(tensor: torch.Tensor) -> bool:
    """Whether one tensor holds a NaN or inf, in a single pass with no copy of it (for weights as they are read
    from a model file, where a full-size temporary per tensor would cost as much as the reading): a min/max
    reduction propagates NaN and shows inf, and float8_e4m3fn (no inf; NaN is S.1111.111) is read as bytes, whose
    extremes are exactly those two patterns (+NaN 0x7F is int8's largest, -NaN 0xFF uint8's)."""
    if not tensor.is_floating_point() or not tensor.numel():
        return False
    if tensor.dtype == torch.float8_e4m3fn:
        return int(tensor.view(torch.int8).amax()) == 0x7F or int(tensor.view(torch.uint8).amax()) == 0xFF
    if tensor.element_size() == 1:  # other float8 formats have no min/max kernels: look at them as float32
        tensor = tensor.float()
    low, high = torch.aminmax(tensor)
    return not (bool(torch.isfinite(low)) and bool(torch.isfinite(high)))
