"""The planner for a run as the engine describes it: a loaded model set, a cached dataset and the configs.

Glue between the trainer and the pure planner: reads the plan inputs off live objects (largest
bucket, longest caption, storage, device, the VAE's size), probes the device's budget and the machine's
RAM, turns 'auto' swapping into a number, and refuses a run whose phases would not fit (`check_run`, pure,
does the deciding). `training/setup.py` calls `plan_run` before the adapter or the swapper touch the model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..core.config import LoraConfig, OptimizerConfig, TrainConfig
from ..core.host_memory import host_ram_bytes
from ..streaming.placement import MIN_RING
from .arch import QwenImageArch, real_arch
from .device import detect_budget, device_bytes_of
from .inference import PartSizes
from .machine import plan_machine, refuse_if_machine_unfit, render_machine
from .phases import AFTER_CACHING, plan_phases, refuse_if_unfit
from .plan import GIB, PlanInputs
from .render import render_phases, render_plan
from .search import auto_blocks_to_swap, auto_checkpointed_blocks
from .timeline import RUNTIME, GpuProfile, deeper_ring, predict, profile_for_device


def planned_storage(components) -> str:
    """The block storage the plan knows for a model set: its mode, "int8" where an int8 file's weights are kept."""
    if components.block_storage.startswith("int8"):
        return "int8"
    return components.storage if components.storage in ("float8", "float8_scaled") else "bfloat16"


def inputs_for_run(components, dataset, lora: LoraConfig, optimizer: OptimizerConfig, train: TrainConfig,
                   blocks_to_swap: int = 0) -> PlanInputs:
    """Plan inputs for training `components` on a cached dataset: its largest image sequence (the family's
    term: the largest bucket, with Edit's control tokens) and its longest caption."""
    family = components.family
    width, height = family.planned_image_size(dataset)  # Edit: with its control tokens' rows
    text_tokens = max(dataset.embedding(s.text_key).shape[0] for s in dataset.samples)
    # The references of the sample planned_image_size plans (the largest area): 2.1's caching and preview terms.
    largest = max(dataset.samples, key=lambda s: s.bucket[0] * s.bucket[1] + sum(
        w * h for w, h in s.condition_sizes))
    return PlanInputs.from_configs(
        lora, optimizer, train, width, height, blocks_to_swap=blocks_to_swap, storage=planned_storage(components),
        text_tokens=text_tokens, device="cuda" if components.device.type == "cuda" else "cpu",
        dataset_images=len(dataset.samples),
        reference_sizes=tuple(tuple(z) for z in largest.condition_sizes),
        vae_image=max((s.bucket for s in dataset.samples), key=lambda b: b[0] * b[1]),  # one image at a time
        vision_sizes=family.planned_vision_sizes(dataset),  # Edit: its controls as its vision tower sees them
    )


@dataclass(frozen=True)
class SwapDecision:
    """How a run streams its blocks: how many, over a ring of how many GPU slots, and why: the plan as text, and
    whether the planner chose the count (the settings said 'auto') or took it as asked."""

    blocks_to_swap: int
    ring_depth: int
    text: str
    auto: bool = False
    # Blocks 0 .. K-1 recompute in backward (streaming.runner.BlockRunner's checkpointed_blocks); None: every block
    # (gradient_checkpointing 'on', or 'auto' where no budget is known); what the status says of it.
    checkpointed_blocks: int | None = None
    checkpointing_note: str | None = None

    @property
    def label(self) -> str:
        return f"{self.blocks_to_swap} (auto)" if self.auto else str(self.blocks_to_swap)


def checkpointing_note(checkpointed: int, num_blocks: int, budget_bytes: int | None, swapped: bool = False) -> str:
    """What the status and the plan say of gradient_checkpointing 'auto' once the planner chose."""
    why = ("blocks are swapped" if swapped else "no GPU budget known" if budget_bytes is None
           else f"fits {budget_bytes / GIB:.0f} GiB")
    return f"checkpointing: {checkpointed} of {num_blocks} blocks recompute (auto, {why})"


def check_run(inputs: PlanInputs, auto: bool, gpu_budget_bytes: int | None, ram_bytes: int | None,
              arch: QwenImageArch | None = None, parts: PartSizes | None = None,
              gpu: GpuProfile | None = None, processes: int = 1, auto_checkpointing: bool = False) -> SwapDecision:
    """How to stream the blocks of a run about to be built, or a UserInputError.

    `auto`: the fewest swapped blocks whose GPU phases fit `gpu_budget_bytes` (0 on the CPU or without a
    budget), and on a GPU the timeline model knows (`gpu`), the ring depth it predicts fastest for the same
    GPU memory (`timeline.deeper_ring`: one more slot, one more block streamed); else `inputs.blocks_to_swap`
    and `inputs.ring_depth`. Then every phase after caching (init, train, preview, save) must fit the budget
    and `ram_bytes` (None: not checked): otherwise the error names the phase, the bytes and the changes that
    would fit, before anything is loaded or built. `processes`: the run's processes on this machine (torchrun's
    LOCAL_WORLD_SIZE), which share one host copy of the frozen weights: the machine's RAM must hold them all
    (`machine.py`), else the error names the shared part, each process's part and how many processes fit.
    `auto_checkpointing` (gradient_checkpointing 'auto', with `inputs.checkpointing`): on CUDA with a budget, the fewest
    recomputing blocks that fit at the chosen swap count (`search.auto_checkpointed_blocks`); else every block."""
    k = inputs.blocks_to_swap
    choice = None
    head = ""
    if auto:
        k = 0
        if inputs.device == "cuda" and gpu_budget_bytes is not None:
            choice = auto_blocks_to_swap(inputs, gpu_budget_bytes, arch, parts)
            k = choice.plan.inputs.blocks_to_swap
            head = f"blocks_to_swap = {k} (the fewest that fit {gpu_budget_bytes / GIB:.2f} GiB)\n\n"
    inputs = dataclasses.replace(inputs, blocks_to_swap=k)
    plan = plan_phases(inputs, arch, ram_bytes, gpu_budget_bytes, parts)
    refuse_if_unfit(plan, AFTER_CACHING, f"blocks_to_swap={'auto' if auto else k}")
    if choice is not None and gpu is not None:
        deeper = deeper_ring(inputs, gpu, arch)
        if deeper is not None:
            deeper_inputs = dataclasses.replace(inputs, blocks_to_swap=len(deeper.placement.streamed),
                                                ring_depth=deeper.placement.ring)
            deeper_plan = plan_phases(deeper_inputs, arch, ram_bytes, gpu_budget_bytes, parts)
            if deeper_plan.fits_phases(AFTER_CACHING):  # a slot weighs a block's frozen weights: it should
                head += (f"ring of {deeper.placement.ring} GPU slots, {deeper_inputs.blocks_to_swap} blocks streamed "
                         f"(timeline model, {gpu.label}: {deeper.seconds:.3f} s/step against "
                         f"{predict(inputs, gpu, arch=arch, path=RUNTIME).seconds:.3f} with a ring of "
                         f"{inputs.ring_depth})\n\n")
                inputs, plan = deeper_inputs, deeper_plan
    checkpointed = note = None
    if auto_checkpointing and inputs.checkpointing:
        num_blocks = (arch or real_arch()).num_blocks
        budget = gpu_budget_bytes if inputs.device == "cuda" else None  # on the CPU: every block, as before 'auto'
        checkpointed = num_blocks if budget is None else auto_checkpointed_blocks(inputs, budget, arch, parts)
        # said in the run's status beside the swap count (runs/registry.py); the plan's header names the depth
        note = checkpointing_note(checkpointed, num_blocks, budget, swapped=bool(inputs.blocks_to_swap))
        if checkpointed < num_blocks:  # the plan the run will train under: fewer recompute, more activations kept
            inputs = dataclasses.replace(inputs, checkpointed_blocks=checkpointed)
            plan = plan_phases(inputs, arch, ram_bytes, gpu_budget_bytes, parts)
        else:
            checkpointed = None  # every block: the runner's default
    text = head + render_plan(plan.training, gpu_budget_bytes) + "\n\n" + render_phases(plan)
    if processes > 1:
        machine = plan_machine(plan, processes, AFTER_CACHING)
        refuse_if_machine_unfit(machine)
        text += "\n\n" + render_machine(machine)
    return SwapDecision(inputs.blocks_to_swap, inputs.ring_depth, text, auto, checkpointed, note)


def plan_run(components, dataset, lora: LoraConfig, optimizer: OptimizerConfig, train: TrainConfig,
             preview_size: tuple[int, int] | None = None, processes: int = 1) -> SwapDecision:
    """How a run streams its blocks, and its plan as text: `check_run` against the device's free memory now
    (CUDA; the ring depth from the timeline model where it knows the GPU by name) and this machine's RAM (`core.host_memory.host_ram_bytes`). On the CPU nothing is swapped under auto and the
    GPU's share is host RAM. Compute in another dtype than bfloat16 is not planned (the activation terms are
    bf16's): the swap count is then taken as it is. `preview_size` (width, height): the previews this run will
    sample, when its caller knows (a script, the `train` command); None: the Preview node's default. Raises a
    `UserInputError` with what to change when a phase does not fit."""
    import torch

    from .arch import arch_for_components
    from .inference import parts_for_components

    auto = train.auto_swap
    cuda = components.device.type == "cuda"
    if components.compute_dtype != torch.bfloat16:
        text = "CPU training: no GPU memory to plan." if not cuda else "The memory plan covers bfloat16 compute only."
        note = (checkpointing_note(components.num_blocks, components.num_blocks, None)
                if train.auto_checkpointing else None)  # every block, as before 'auto'
        return SwapDecision(0 if auto else train.blocks_to_swap, MIN_RING, text, auto, None, note)
    inputs = inputs_for_run(components, dataset, lora, optimizer, train, 0 if auto else train.blocks_to_swap)
    if preview_size is not None:
        inputs = dataclasses.replace(inputs, preview_width=preview_size[0], preview_height=preview_size[1])
    budget = gpu = None
    if cuda:  # the context exists already and is outside the free memory measured
        # the model set's tensors already on the device are in the plan: given back, not counted as taken (a previous
        # run's leftovers and other nodes' models are taken: `device.room_now`)
        held = device_bytes_of([components.transformer, components.vae, components.text_encoder], components.device)
        budget = detect_budget(components.device, counted_bytes=held).bytes
        inputs = dataclasses.replace(inputs, cuda_context_bytes=0)
        gpu = profile_for_device(torch.cuda.get_device_name(components.device))
    return check_run(inputs, auto, budget, host_ram_bytes(), arch_for_components(components),
                     parts_for_components(components), gpu, processes, auto_checkpointing=train.auto_checkpointing)
