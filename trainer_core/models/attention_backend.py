"""Which attention kernel the transformer's joint attention runs on: chosen once per device (`choose`), said in
the run's status, overridable by `TrainConfig.attention_backend`, and applied per call (`attend`).

Why a choice at all: PyTorch's SDPA picks FlashAttention-2 on a CUDA GPU by default, while on Hopper (sm90) and
datacenter Blackwell (sm100) its cuDNN backend is reported 1.7-2.3x faster (transformers PR #48163), and the
FlashAttention-3 package faster still on Hopper (DESIGN.md section 13). A mask forces SDPA off the flash kernels,
so a call whose text has no padding runs without one (`drop_full_mask`; the trainer already passes None for an
unpadded batch, `models.text.pad_prompt_batch`).

The choices (`BACKENDS`):
    auto        the device's best (the table in `choose`)
    sdpa        PyTorch's own pick (no preference given), what diffusers does
    cudnn, flash, efficient, math
                SDPA with that backend first (PyTorch falls back down its list where the call cannot use it:
                a mask, fp32 inputs, an odd head size)
    flash_attn_3, flash_attn_2
                the FlashAttention packages (`flash_attn_interface`, `flash_attn`), unmasked bf16/fp16 calls only;
                other calls go to SDPA's pick

Tensors here are laid out (B, S, H, Dh), as diffusers' attention dispatch takes them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core.errors import UserInputError

AUTO, SDPA, CUDNN, FLASH, EFFICIENT, MATH, FA3, FA2 = (
    "auto", "sdpa", "cudnn", "flash", "efficient", "math", "flash_attn_3", "flash_attn_2")
BACKENDS = (AUTO, SDPA, CUDNN, FLASH, EFFICIENT, MATH, FA3, FA2)
_PACKAGES = {FA3: "flash_attn_interface", FA2: "flash_attn"}


@dataclass(frozen=True)
class AttentionChoice:
    """The backend a run's unmasked attention calls use (`backend`, one of BACKENDS less auto) and why."""

    backend: str
    reason: str

    @property
    def status(self) -> str:
        return f"attention: {self.backend} ({self.reason})"


def installed_packages() -> frozenset[str]:
    """The FlashAttention packages importable here (FA3, FA2 names), without importing them."""
    return frozenset(name for name, module in _PACKAGES.items() if importlib.util.find_spec(module) is not None)


def choose(setting: str, device_type: str, capability: tuple[int, int] | None,
           packages: frozenset[str] = frozenset()) -> AttentionChoice:
    """The backend for `setting` on a device of `device_type` ('cuda', 'cpu', ...) with compute `capability`
    (major, minor) or None, given the FlashAttention `packages` installed (FA3, FA2). Pure: the tests feed it
    the capability tuples of the cards.

    auto: CPU and others -> sdpa (PyTorch's pick); CUDA sm90 with FlashAttention-3 installed -> flash_attn_3;
    sm90 / sm100 (Hopper, datacenter Blackwell) -> cudnn; sm80 and newer with FlashAttention-2 installed ->
    flash_attn_2; other CUDA cards -> flash (SDPA's FlashAttention-2, falling back where it cannot run)."""
    if setting not in BACKENDS:
        raise ValueError(f"attention_backend={setting!r}: choose one of {', '.join(BACKENDS)}")
    cuda = device_type == "cuda" and capability is not None
    if setting != AUTO:
        if setting in (FA3, FA2) and setting not in packages:
            raise UserInputError(f"attention_backend={setting}: the package {_PACKAGES[setting]} is not installed; "
                             "install it or choose auto")
        if setting in (CUDNN, FLASH, EFFICIENT, FA3, FA2) and not cuda:
            return AttentionChoice(SDPA, f"{setting} asked for, but it needs a CUDA GPU: PyTorch's pick")
        return AttentionChoice(setting, "as set")
    if not cuda:
        return AttentionChoice(SDPA, f"PyTorch's pick on {device_type}")
    arch = f"sm{capability[0]}{capability[1]}"
    if capability[0] == 9 and FA3 in packages:
        return AttentionChoice(FA3, f"{arch}: FlashAttention-3 installed")
    if capability[0] in (9, 10):
        return AttentionChoice(CUDNN, f"{arch}: cuDNN's SDPA on Hopper / datacenter Blackwell")
    if capability >= (8, 0) and FA2 in packages:
        return AttentionChoice(FA2, f"{arch}: FlashAttention-2 installed")
    return AttentionChoice(FLASH, f"{arch}: SDPA's flash kernel")


def choose_for(setting: str, device: torch.device) -> AttentionChoice:
    """`choose` for a real device (its capability read once, the packages found here)."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return choose(setting, device.type, capability, installed_packages())


def drop_full_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """None for a mask with no padded token (every entry true / nonzero): attention without a mask is the same
    arithmetic (a masked score adds 0) on a faster kernel. Reads the mask's values (one device sync on a GPU):
    call once per forward, not per block (the fused processor keeps the answer for the mask object)."""
    if mask is None or bool(mask.all()):
        return None
    return mask


_SDPA_ORDER = {CUDNN: "CUDNN_ATTENTION", FLASH: "FLASH_ATTENTION", EFFICIENT: "EFFICIENT_ATTENTION", MATH: "MATH"}


def _sdpa_priority(backend: str) -> list:
    """`backend` first, then the others in PyTorch's own order, so a call the first cannot take still runs."""
    from torch.nn.attention import SDPBackend

    first = getattr(SDPBackend, _SDPA_ORDER[backend])
    rest = [getattr(SDPBackend, n) for n in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")]
    return [first, *(b for b in rest if b != first)]


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
           backend: str) -> torch.Tensor:
    """Joint attention (B, S, H, Dh) x3 -> (B, S, H, Dh) with an optional boolean mask (B, 1, 1, S) (True =
    attend), on `backend` (an AttentionChoice's). sdpa is exactly what diffusers' native dispatch does."""
    if backend in (FA3, FA2) and mask is None and query.dtype in (torch.bfloat16, torch.float16):
        return _flash_attn_package(backend, query, key, value)
    q, k, v = (t.permute(0, 2, 1, 3) for t in (query, key, value))  # (B, H, S, Dh)
    if backend in _SDPA_ORDER:  # (on a CPU only math gets here: `choose` turns the GPU ones into sdpa)
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(_sdpa_priority(backend), set_priority=True):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
    return out.permute(0, 2, 1, 3)


def _flash_attn_package(backend: str, query, key, value) -> torch.Tensor:
    """The FlashAttention packages take (B, S, H, Dh) as they are. FlashAttention-3's function returns
    (out, softmax_lse) in some releases and out in others."""
    if backend == FA3:
        from flash_attn_interface import flash_attn_func
    else:
        from flash_attn import flash_attn_func
    out = flash_attn_func(query, key, value, causal=False)
    return out[0] if isinstance(out, tuple) else out
