"""VRAM and host-RAM planner for Qwen-Image LoRA training: predict, term by term, what a run needs.

    plan = plan_memory(PlanInputs(width=1024, height=1024, rank=32, blocks_to_swap=16))
    print(render_plan(plan))
    choice = auto_blocks_to_swap(PlanInputs(width=1024, height=1024, rank=32), budget_bytes=16 * GIB)

One concern per module, so the maths can be read and tested without a GPU or a model:
    arch.py         parameter counts read off a transformer (meta device for the real one)
    activations.py  one block's saved activations (exact) and working memory (measured)
    plan.py         PlanInputs -> MemoryPlan: the byte formulas, term by term
    search.py       the fewest swapped blocks that fit a budget; advice when nothing fits
    device.py       the free memory of a CUDA device (the only part that probes one)
    render.py       plans and choices as text tables
    for_run.py      glue for a run: inputs from a model set and a cached dataset; `plan_run`
"""

from .arch import QwenImageArch, arch_for_components, arch_from_transformer, real_arch
from .device import Budget, auto_for_device, detect_budget
from .for_run import inputs_for_run, plan_run
from .plan import GIB, MIB, MemoryPlan, PlanInputs, Term, plan_memory
from .render import render_budget_table, render_choice, render_plan
from .search import SwapChoice, auto_blocks_to_swap

__all__ = [
    "GIB", "MIB", "Budget", "MemoryPlan", "PlanInputs", "QwenImageArch", "SwapChoice", "Term",
    "arch_for_components", "arch_from_transformer", "auto_blocks_to_swap", "auto_for_device", "detect_budget",
    "inputs_for_run", "plan_memory", "plan_run", "real_arch", "render_budget_table", "render_choice",
    "render_plan",
]
