"""The plan and the swap choice as plain-text tables: what the CLI prints and the Init Trainer node shows.

Formatting only: every number comes from `plan.py` and `search.py`.
"""

from __future__ import annotations

from .arch import QwenImageArch
from .plan import GIB, MemoryPlan, PlanInputs, Term
from .search import SwapChoice, auto_blocks_to_swap


def render_plan(plan: MemoryPlan, budget_bytes: int | None = None) -> str:
    """The plan as a plain-text table (what the CLI prints and a node shows)."""
    p = plan.inputs
    lines = [
        f"Memory plan: {p.width}x{p.height}, batch {p.batch}, {p.text_tokens} text tokens, LoRA rank {p.rank} "
        f"({p.targets}, {p.lora_dtype}), {p.storage} blocks, {p.optimizer}, "
        f"checkpointing {'on' if p.checkpointing else 'off'}, blocks_to_swap {p.blocks_to_swap}",
        "",
    ]
    lines += _section(f"GPU at the training peak ({plan.peak_phase})", plan.gpu)
    if budget_bytes is not None:
        verdict = "fits" if plan.gpu_total <= budget_bytes else "does NOT fit"
        lines.append(f"{'budget':<38}{budget_bytes / GIB:>9.2f} GiB  {verdict}")
    lines.append(f"{'(optimizer step phase total)':<38}{plan.optimizer_step_peak / GIB:>9.2f} GiB")
    lines.append("")
    lines += _section("Host RAM while training", plan.host_training)
    lines.append("")
    lines += _section("Host RAM while loading (transformer on the CPU)", plan.host_loading)
    lines.append("")
    lines += _section("GPU while caching latents and prompts", plan.gpu_caching)
    for note in plan.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _section(title: str, terms: list[Term]) -> list[str]:
    width = 38
    lines = [title, "-" * (width + 13)]
    for t in terms:
        lines.append(f"{t.name:<{width}}{t.bytes / GIB:>9.2f} GiB  {t.note}")
    lines.append(f"{'total':<{width}}{sum(t.bytes for t in terms) / GIB:>9.2f} GiB")
    return lines


def render_choice(choice: SwapChoice) -> str:
    head = (f"blocks_to_swap = {choice.blocks_to_swap} (the fewest that fit {choice.budget_bytes / GIB:.2f} GiB)"
            if choice.fits else "\n".join(choice.advice))
    return head + "\n\n" + render_plan(choice.plan, choice.budget_bytes)


def render_budget_table(inputs: PlanInputs, budgets_gib: list[float], arch: QwenImageArch | None = None) -> str:
    """One line per budget: the swap count it needs, the planned GPU peak and host RAM while training."""
    lines = [f"{'budget':>8}  {'blocks_to_swap':>14}  {'GPU peak':>9}  {'host RAM (train)':>16}  {'host RAM (load)':>15}"]
    for b in budgets_gib:
        c = auto_blocks_to_swap(inputs, int(b * GIB), arch)
        k = str(c.blocks_to_swap) if c.fits else "none fits"
        lines.append(f"{b:>5.0f} GiB  {k:>14}  {c.plan.gpu_total / GIB:>5.2f} GiB  "
                     f"{c.plan.host_training_total / GIB:>12.2f} GiB  {c.plan.host_loading_total / GIB:>11.2f} GiB")
    return "\n".join(lines)
