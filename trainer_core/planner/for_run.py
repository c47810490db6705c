"""The planner for a run as the engine describes it: a loaded model set, a cached dataset and the configs.

Glue between the trainer and the pure planner: reads the plan inputs off live objects (largest
bucket, longest caption, storage, device), probes the device's budget, and turns 'auto' swapping into
a number. `trainer.py` calls `plan_run`.
"""

from __future__ import annotations

import dataclasses

from ..config import LoraConfig, OptimizerConfig, TrainConfig
from .device import auto_for_device, detect_budget
from .plan import PlanInputs, plan_memory
from .render import render_choice, render_plan


def inputs_for_run(components, dataset, lora: LoraConfig, optimizer: OptimizerConfig, train: TrainConfig,
                   blocks_to_swap: int = 0) -> PlanInputs:
    """Plan inputs for training `components` on a cached dataset: its largest bucket and longest caption."""
    width, height = max((s.bucket for s in dataset.samples), key=lambda b: b[0] * b[1])
    from ..edit.objective import planned_image_size  # Qwen-Image-Edit: control tokens lengthen the sequence

    width, height = planned_image_size(dataset) or (width, height)
    text_tokens = max(dataset.embedding(s.text_key).shape[0] for s in dataset.samples)
    return PlanInputs.from_configs(
        lora, optimizer, dataclasses.replace(train, blocks_to_swap=blocks_to_swap), width, height,
        storage=components.storage if components.storage in ("float8", "float8_scaled") else "bfloat16",
        text_tokens=text_tokens, device="cuda" if components.device.type == "cuda" else "cpu",
        dataset_images=len(dataset.samples),
    )


def plan_run(components, dataset, lora: LoraConfig, optimizer: OptimizerConfig, train: TrainConfig) -> tuple[int, str]:
    """(blocks_to_swap to use, the plan as text) for a run. `train.blocks_to_swap` = AUTO_SWAP picks the fewest
    swapped blocks that fit the device's free memory. On the CPU nothing is swapped under auto and there is
    no GPU plan to show. Raises a `UserInputError` with what to change when nothing fits."""
    import torch

    from ..errors import UserInputError
    from .arch import arch_for_components

    auto = train.auto_swap
    if components.device.type != "cuda":
        return (0 if auto else train.blocks_to_swap), "CPU training: no GPU memory to plan."
    if components.compute_dtype != torch.bfloat16:
        return (0 if auto else train.blocks_to_swap), "The memory plan covers bfloat16 compute only."
    arch = arch_for_components(components)
    inputs = inputs_for_run(components, dataset, lora, optimizer, train, train.blocks_to_swap if not auto else 0)
    if not auto:
        return train.blocks_to_swap, render_plan(plan_memory(inputs, arch), detect_budget(components.device).bytes)
    choice = auto_for_device(inputs, components.device, arch=arch)
    if not choice.fits:
        raise UserInputError("blocks_to_swap=auto: " + render_choice(choice))
    return choice.blocks_to_swap, render_choice(choice)
