"""The memory budget of a CUDA device, probed now, and the swap choice against it.

The one part of the planner that touches a device (torch.cuda, imported when called): kept apart so
the plan maths and the search stay pure and testable on any machine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .arch import QwenImageArch
from .inference import PartSizes
from .plan import GIB, MIB, PlanInputs
from .search import SwapChoice, auto_blocks_to_swap


@dataclass(frozen=True)
class Budget:
    bytes: int
    source: str
    context_included: bool  # the CUDA context already exists and is not part of `bytes`


def detect_budget(device=None, reserve_bytes: int = 512 * MIB) -> Budget:
    """Free memory of a CUDA device now (plus what torch's cache already holds), less `reserve_bytes`.

    The CUDA context exists once this runs, so its memory is already outside the free figure: plan with
    `cuda_context_bytes=0` against this budget (`auto_for_device` does).
    """
    import torch

    device = torch.device(device or "cuda")
    free, total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device)
    return Budget(free + cached - reserve_bytes, f"{device}: {free / GIB:.1f} GiB free of {total / GIB:.1f} GiB, "
                  f"{cached / GIB:.1f} GiB cached by torch, {reserve_bytes / GIB:.1f} GiB kept back", True)


def auto_for_device(inputs: PlanInputs, device=None, reserve_bytes: int = 512 * MIB,
                    arch: QwenImageArch | None = None, parts: PartSizes | None = None) -> SwapChoice:
    """`auto_blocks_to_swap` against the free memory of a CUDA device."""
    budget = detect_budget(device, reserve_bytes)
    return auto_blocks_to_swap(dataclasses.replace(inputs, cuda_context_bytes=0), budget.bytes, arch, parts)
