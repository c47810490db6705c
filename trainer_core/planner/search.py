"""Choosing blocks_to_swap: the fewest swapped blocks whose planned GPU peak fits a budget.

The peak is the largest of the phases that depend on the swap count (`phases.gpu_peak_after_caching`: init,
train, preview, save), so a chosen count leaves room for a preview's VAE decode and denoising forward.

Pure search over `plan.plan_memory`: the budget is a number handed in, never read from a device
(`device.py` does that), so the choice is testable anywhere. When nothing fits, `advice` says which
single change (checkpointing, batch, LoRA dtype, optimizer, rank, targets, resolution) would fit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .arch import QwenImageArch, real_arch
from .inference import PartSizes
from .phases import gpu_peak_after_caching, training_candidates
from .plan import GIB, MemoryPlan, PlanInputs, plan_memory
from ..streaming.placement import ring_for


@dataclass
class SwapChoice:
    blocks_to_swap: int | None  # None: nothing fits
    budget_bytes: int
    plan: MemoryPlan  # at the chosen count, or at the most swapping when nothing fits
    advice: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.blocks_to_swap is not None


def auto_blocks_to_swap(inputs: PlanInputs, budget_bytes: int, arch: QwenImageArch | None = None,
                        parts: PartSizes | None = None) -> SwapChoice:
    """The smallest blocks_to_swap whose planned GPU peak (training, previews, init, save) fits `budget_bytes`.

    When even the most swapping (all blocks but one) does not fit, `blocks_to_swap` is None and `advice`
    lists changes that would fit, each with its planned peak and the swap count it needs. `parts`: the VAE
    and text encoder sizes (default: the real model's).
    """
    arch = arch or real_arch()
    k, plan = _fewest_swapped(inputs, budget_bytes, arch, parts)
    if k is not None:
        return SwapChoice(k, budget_bytes, plan)
    return SwapChoice(None, budget_bytes, plan, _advice(plan, budget_bytes, arch, parts))


def _fewest_swapped(inputs: PlanInputs, budget: int, arch: QwenImageArch,
                    parts: PartSizes | None = None) -> tuple[int | None, MemoryPlan]:
    """(smallest fitting swap count or None, its plan or the plan with the most swapping).

    The peak need not fall with the swap count while the GPU ring grows with it (k = 1 .. ring depth: each new
    slot takes a block's whole blob, about what the block swapped out freed, and can take a little more), so
    those counts are tried one by one; past the ring depth a further swapped block only leaves the GPU, so the
    peak falls with k and a bisection finds the smallest count that fits (tests/planner/test_memory.py checks it against
    trying every count)."""
    def plan_at(k: int) -> tuple[bool, MemoryPlan]:
        plan = plan_memory(dataclasses.replace(inputs, blocks_to_swap=k), arch)
        return gpu_peak_after_caching(plan, arch, parts, budget) <= budget, plan

    most = arch.num_blocks - 1
    ring_full = min(ring_for(most, inputs.ring_depth), most)  # from this count on, the ring holds its depth
    for k in range(ring_full + 1):
        fits, plan = plan_at(k)
        if fits:
            return k, plan
    fits, plan = plan_at(most)
    if not fits:
        return None, plan
    low, high, fitting = ring_full, most, plan  # fits(low) is False, fits(high) is True
    while high - low > 1:
        middle = (low + high) // 2
        fits, plan = plan_at(middle)
        if fits:
            high, fitting = middle, plan
        else:
            low = middle
    return high, fitting


def _advice(plan: MemoryPlan, budget: int, arch: QwenImageArch, parts: PartSizes | None = None) -> list[str]:
    p = plan.inputs
    gib = lambda b: f"{b / GIB:.1f} GiB"  # noqa: E731
    lines = [f"Nothing fits in {gib(budget)}: even with {p.blocks_to_swap} of {arch.num_blocks} blocks swapped "
             f"the GPU peak is {gib(gpu_peak_after_caching(plan, arch, parts, budget))}. Changes that would fit (with the swap count they need):"]
    candidates = training_candidates(p)
    found = False
    for label, change in candidates:
        k, fitting = _fewest_swapped(dataclasses.replace(p, **change), budget, arch, parts)
        if k is not None:
            lines.append(f"  - {label}: {gib(gpu_peak_after_caching(fitting, arch, parts, budget))} with blocks_to_swap={k}")
            found = True
    if not found:
        lines.append("  - no single change fits; combine a lower resolution with a lower rank, or use a larger GPU")
    return lines


def auto_checkpointed_blocks(inputs: PlanInputs, budget_bytes: int, arch: QwenImageArch | None = None,
                             parts: PartSizes | None = None) -> int:
    """The fewest blocks that recompute in backward (blocks 0 .. K-1; the others keep their activations) whose
    planned GPU peak fits `budget_bytes`, at `inputs`' swap count: like the swap count, recomputing only as deep as
    memory needs (a recompute costs about a third of a block's step time). Every block when any block is streamed
    (the streaming schedule assumes every block recomputes) or when nothing fits; 0 without checkpointing.

    The peak falls as K grows from 1 (each recomputing block keeps only its inputs instead of its activations);
    K = 0 has no recompute at all and is tried on its own, then a bisection over 1 .. num_blocks."""
    arch = arch or real_arch()
    n = arch.num_blocks
    if not inputs.checkpointing:
        return 0
    if inputs.blocks_to_swap:
        return n

    def fits(k: int) -> bool:
        plan = plan_memory(dataclasses.replace(inputs, checkpointed_blocks=k), arch)
        return gpu_peak_after_caching(plan, arch, parts, budget_bytes) <= budget_bytes

    if fits(0):
        return 0
    if not fits(n):
        return n  # nothing fits: the trainer's default, and the swap search's advice says what would
    low, high = 0, n  # not fits(low), fits(high); fits grows with k from 1 on
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle
    return high
