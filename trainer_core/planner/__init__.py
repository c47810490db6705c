"""VRAM and host-RAM planner for Qwen-Image LoRA training: predict, term by term, what a run needs.

    plan = plan_memory(PlanInputs(width=1024, height=1024, rank=32, blocks_to_swap=16))
    print(render_plan(plan))
    choice = auto_blocks_to_swap(PlanInputs(width=1024, height=1024, rank=32), budget_bytes=16 * GIB)
    phases = plan_phases(PlanInputs(blocks_to_swap=29), ram_bytes=32 * GIB, gpu_budget_bytes=16 * GIB)
    refuse_if_unfit(phases)     # a UserInputError naming the phase, the bytes and what would fit

One concern per module, so the maths can be read and tested without a GPU or a model:
    arch.py         parameter counts read off a transformer (meta device for the real one)
    activations.py  one block's saved activations (exact) and working memory (measured)
    single_stream.py  the same for a Qwen-Image 2.1 (single-stream) block
    inference.py    no-grad working memory: preview forward, VAE encode/decode, text encoder (measured)
    plan.py         PlanInputs -> MemoryPlan: the byte formulas, term by term, of training
    measured_terms.py  the terms not counted tensor by tensor (slack, baselines, residues), each with its measurement
    phases.py       every phase of a run (load, cache, init, train, preview, save), GPU and host RAM,
                    checked against the machine; what would fit; the text encoder's precision
    caching.py      the cache phase's two steps (prompts with the text encoder, latents with the VAE)
    references.py   what 2.1's reference images add: vision tokens, the vision tower's forward, preview KV cache
    search.py       the fewest swapped blocks whose phases fit a budget; advice when nothing fits
    machine.py      several processes on one machine: its host RAM (one shared copy + per process), per GPU
    device.py       what a CUDA device can still give (`room_now`, the one rule of every run-time decision; the only
                    part that probes one), and the choices against it: the swap count, the text encoder file's fp8
                    mode 'auto' (`resolve_text_encoder_fp8`), the caption batch, the preview's tiled decode
    render.py       plans and choices as text tables
    for_run.py      glue for a run: inputs from a model set and a cached dataset; `check_run`, `plan_run`
"""

from .arch import QwenImageArch, arch_for_components, arch_from_transformer, real_arch
from .device import Budget, auto_for_device, detect_budget, resolve_text_encoder_fp8
from .for_run import SwapDecision, check_run, inputs_for_run, plan_run
from .phases import (
    PHASES,
    PhasePlan,
    choose_text_encoder_storage,
    plan_phases,
    refuse_if_unfit,
)
from .plan import GIB, MIB, MemoryPlan, PlanInputs, Term, plan_memory
from .render import render_budget_table, render_choice, render_phases, render_plan
from .search import SwapChoice, auto_blocks_to_swap

__all__ = [
    "GIB", "MIB", "PHASES", "Budget", "MemoryPlan", "PhasePlan", "PlanInputs", "QwenImageArch", "SwapChoice", "SwapDecision",
    "Term",
    "arch_for_components", "arch_from_transformer", "auto_blocks_to_swap", "auto_for_device", "check_run",
    "choose_text_encoder_storage", "detect_budget", "inputs_for_run", "plan_memory", "plan_phases",
    "plan_run", "real_arch", "refuse_if_unfit", "render_budget_table", "render_choice", "render_phases", "render_plan",
    "resolve_text_encoder_fp8",
]
