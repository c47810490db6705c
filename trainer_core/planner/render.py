"""The plan and the swap choice as plain-text tables: what the CLI prints and the Init Trainer node shows.

Formatting only: every number comes from `plan.py` and `search.py`.
"""

from __future__ import annotations

import dataclasses

from .arch import QwenImageArch
from .phases import HOST_RESERVE_BYTES, PhasePlan, plan_phases
from .plan import GIB, MemoryPlan, PlanInputs, Term
from .search import SwapChoice, auto_blocks_to_swap


ADAPTER_NAMES = {"lora": "LoRA", "lokr": "LoKr", "loha": "LoHa"}


def _references(p) -> str:
    if not p.reference_sizes:
        return ""
    sizes = ", ".join(f"{w}x{h}" for w, h in p.reference_sizes)
    return f" (the target and {len(p.reference_sizes)} reference image(s) of {sizes} px as rows)"


def _checkpointing(p) -> str:
    if not p.checkpointing:
        return "off"
    return "on" if p.checkpointed_blocks is None else f"in blocks 0..{p.checkpointed_blocks - 1}" \
        if p.checkpointed_blocks else "planned, no block recomputes"


def render_plan(plan: MemoryPlan, budget_bytes: int | None = None) -> str:
    """The plan as a plain-text table (what the CLI prints and a node shows)."""
    p = plan.inputs
    lines = [
        f"Memory plan: {p.width}x{p.height}{_references(p)}, batch {p.batch}, {p.text_tokens} text tokens, {ADAPTER_NAMES[p.adapter]} rank {p.rank} "
        f"({p.targets}, {p.lora_dtype}), {p.storage} blocks, {p.optimizer}, "
        f"checkpointing {_checkpointing(p)}, blocks_to_swap {p.blocks_to_swap}",
        "",
    ]
    lines += _section(f"GPU at the training peak ({plan.peak_phase})", plan.gpu)
    if budget_bytes is not None:
        verdict = "fits" if plan.gpu_total <= budget_bytes else "does NOT fit"
        lines.append(f"{'budget':<38}{budget_bytes / GIB:>9.2f} GiB  {verdict}")
    lines.append(f"{'(optimizer step phase total)':<38}{plan.optimizer_step_peak / GIB:>9.2f} GiB")
    lines.append("")
    lines += _section("Host RAM while training (the phases below add the VAE and a checkpoint's copy)", plan.host_training)
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


def render_phases(plan: PhasePlan, terms: bool = False) -> str:
    """Each phase's GPU and host RAM peak, the verdict against the budget and RAM, and what would fit.
    `terms`: each phase's terms too."""
    p = plan.inputs
    gpu_head = "GPU budget " + (f"{plan.gpu_budget_bytes / GIB:.2f} GiB" if plan.gpu_budget_bytes is not None
                                else "not checked")
    ram_head = ("host RAM not checked" if plan.ram_bytes is None else
                f"host RAM {plan.ram_bytes / GIB:.2f} GiB, {plan.usable_ram_bytes / GIB:.2f} usable "
                f"({HOST_RESERVE_BYTES / GIB:.0f} GiB left to the system)")
    streamed = f", {p.text_encoder_streamed} decoder layers streamed" if p.text_encoder_streamed else ""
    streamed += f", {p.vision_streamed} vision blocks streamed" if p.vision_streamed else ""
    captioning = f"; VL model {p.caption_storage} while captioning" if "caption" in plan.phases else ""
    lines = [f"Per phase ({gpu_head}; {ram_head}{captioning}; text encoder {p.text_encoder_storage}{streamed} while "
             f"caching; previews "
             f"{p.preview_width}x{p.preview_height}{' with CFG' if p.preview_cfg else ''}; device {p.device}):",
             f"{'phase':<9}{'GPU peak':>12}{'host RAM':>12}  verdict", "-" * 60]
    for name, phase in plan.phases.items():
        over = [s.resource for s in plan.shortfalls((name,))]
        verdict = f"does NOT fit ({', '.join(over)})" if over else "fits"
        lines.append(f"{name:<9}{phase.gpu_bytes / GIB:>8.2f} GiB{phase.host_bytes / GIB:>8.2f} GiB  {verdict}"
                     + (f"  ({phase.note})" if phase.note else ""))
        if terms:
            lines += _phase_term_lines(phase)
    if plan.fits:
        lines.append("Every phase fits.")
    else:
        lines.append("Does NOT fit." + (" Changes that would fit:" if plan.suggestions else
                                         " No single change of the settings fits."))
        lines += [f"  - {line}" for line in plan.suggestions]
    return "\n".join(lines)


def _phase_term_lines(phase) -> list[str]:
    return ([f"    GPU   {t.name:<44}{t.bytes / GIB:>7.2f} GiB  {t.note}" for t in phase.gpu]
            + [f"    host  {t.name:<44}{t.bytes / GIB:>7.2f} GiB  {t.note}" for t in phase.host])


def render_phase_terms(plan: PhasePlan, name: str) -> str:
    """Phase `name`'s terms, GPU then host RAM, under its peaks (what `plan --caption` prints for captioning)."""
    phase = plan.phases[name]
    head = f"The {name} phase, term by term: GPU {phase.gpu_bytes / GIB:.2f} GiB, host RAM {phase.host_bytes / GIB:.2f} GiB"
    return "\n".join([head + (f" ({phase.note})" if phase.note else ""), *_phase_term_lines(phase)])


def render_budget_table(inputs: PlanInputs, budgets_gib: list[float], arch: QwenImageArch | None = None,
                        ram_gib: float | None = None) -> str:
    """One line per budget: the swap count it needs, and the GPU and host RAM peaks over all phases."""
    lines = [f"{'budget':>8}  {'blocks_to_swap':>14}  {'GPU peak':>16}  {'host RAM peak':>17}  verdict"]
    for b in budgets_gib:
        c = auto_blocks_to_swap(inputs, int(b * GIB), arch)
        k = c.plan.inputs.blocks_to_swap
        plan = plan_phases(dataclasses.replace(inputs, blocks_to_swap=k), arch,
                           None if ram_gib is None else int(ram_gib * GIB), int(b * GIB), suggest=False)
        (gpu_phase, gpu), (host_phase, host) = plan.peak("gpu"), plan.peak("host")
        lines.append(f"{b:>5.0f} GiB  {k if c.fits else 'none fits':>14}  {gpu / GIB:>6.2f} GiB {gpu_phase:<7}  "
                     f"{host / GIB:>6.2f} GiB {host_phase:<7}  {'fits' if plan.fits else 'does NOT fit'}")
    return "\n".join(lines)
