"""Building a trainer's parts, in the order they depend on each other:

memory plan (resolves blocks_to_swap 'auto'; refuses what does not fit, before any weight is read) ->
the transformer read into that placement -> the LoRA injected (or continued from a LoRA file) -> the block
runner (streaming, checkpointing, the float8 compute path) -> the optimizer -> the data order and the step.
"""

from __future__ import annotations

import dataclasses

from ..adapters.lora import compute_in_input_dtype, inject_lora, matching_preset, target_module_names
from ..adapters.lora_files import check_targets, load_into_adapter, read_lora_file
from ..core.config import NO_LORA
from ..core.errors import UserInputError
from ..core.finite import all_finite
from ..data.order import DataOrder
from ..models.components import module_fingerprint
from ..planner.for_run import plan_run
from ..streaming.placement import default_placement, tail_placement
from ..streaming.runner import BlockRunner, swapped_blocks
from .ema import build_average
from .host_copy import attach_before_load, share_host_copy
from .idle_settings import check_trainable
from .optim import build_optimizer
from .preservation import check_cached as check_preservation_cached
from .step import FlowMatchingStep

# `trainer` below is the recipe's Trainer (recipe.py), which holds the state these functions work on; it is
# not imported here, so the recipe's components stay below the recipe.


def check_inputs(components, dataset, train) -> None:
    """What the Trainer refuses before it builds anything: settings that do not fit the model, an empty cached
    dataset or one no step could learn from, preservation without the class captions it needs (preservation.py)."""
    train.check_model(num_blocks=components.num_blocks)
    if not dataset.samples:
        raise UserInputError("the cached dataset has no samples: check the Dataset node's folder.")
    check_trainable(dataset.samples)  # some image must weigh, and some must be the subject (idle_settings.py)
    check_preservation_cached(dataset.samples, train.preservation_weight)


def build(trainer: "Trainer", init_lora, preview_size) -> None:
    components, dataset = trainer.components, trainer.dataset
    components.family.check_cached(dataset)  # a cache another kind of family made: refused before anything loads
    lora, train = trainer.lora_cfg, trainer.train_cfg
    trainer.base_fingerprint = components.fingerprint("transformer")  # before the adapter joins the model
    modules = None
    skeleton = components.skeleton()  # module names and shapes; the weights may not be read yet
    if init_lora is not None:
        if lora.adapter != "lora":
            raise UserInputError(f"continue_from_lora starts from a plain LoRA file, and the LoRA Config asks for "
                                 f"adapter={lora.adapter}: set adapter to lora to continue that file, or choose "
                                 f"{NO_LORA!r} to train a new LoKr or LoHa.")
        trainer.init_lora = read_lora_file(init_lora, model=skeleton)  # kohya names and fused Linears: this model's
        check_targets(skeleton, trainer.init_lora)
        modules = trainer.init_lora.targets
        # The file decides rank, alpha and the adapted modules; dropout and dtype come from the settings.
        trainer.lora_cfg = lora = dataclasses.replace(
            lora, rank=trainer.init_lora.rank, alpha=trainer.init_lora.alpha,
            targets=matching_preset(skeleton, modules) or lora.targets)
    trainer.lora_modules = modules or target_module_names(skeleton, lora.targets)

    # blocks_to_swap 'auto' becomes a number here, from the memory plan at the dataset's largest bucket
    # (against the device's free memory now: free other models first).
    swap = plan_run(components, dataset, lora, trainer.optim_cfg, train, preview_size,
                    processes=trainer.replicas.local_size)
    trainer.memory_plan = swap.text
    trainer.train_cfg = train = dataclasses.replace(train, blocks_to_swap=swap.blocks_to_swap)
    # A lazy model set reads the transformer now, straight into this placement. A process that is not its machine's
    # first takes the frozen host weights from the machine's shared copy instead of the file (host_copy.py).
    posted = attach_before_load(trainer.replicas) if components.streams_transformer else None
    trainer.transformer = transformer = components.ensure_transformer(
        trainer.device, host_blocks=swapped_blocks(components.num_blocks, train.blocks_to_swap),
        given=posted.given if posted is not None else None)
    # Checkpoints name the base model they were trained on. A model set read from files names it by its
    # file's identity; checkpoints written when every model set was named by its weights are still continued:
    # their name is the weights' fingerprint, taken here before the adapter joins.
    trainer.accepted_base_fingerprints = {trainer.base_fingerprint}
    if components.transformer_source is not None and trainer.run_dir is not None:
        trainer.accepted_base_fingerprints.add(module_fingerprint(transformer))

    trainer.params = inject_lora(transformer, lora, seed=train.seed, modules=trainer.lora_modules)
    # LoRA matmuls in the compute dtype, fp32 weights and updates (a comparison may ask for peft's fp32 cast)
    compute_in_input_dtype(transformer, enabled=trainer.comparison.lora_compute == "compute dtype")
    if trainer.init_lora is not None:
        load_into_adapter(transformer, trainer.init_lora.weights)
        if not all_finite(trainer.params):  # finite in the file, but not once cast (float64 beyond float32's range)
            raise UserInputError(
                f"LoRA file {trainer.init_lora.path} holds values too large for LoRA dtype {lora.dtype}: they become "
                "inf. Choose another LoRA file.")
    trainer.param_names = [n for n, p in transformer.named_parameters() if p.requires_grad]

    place = tail_placement if trainer.comparison.placement == "tail" else default_placement
    placement = place(components.num_blocks, train.blocks_to_swap, swap.ring_depth)
    # Several processes on a machine: one host copy of the frozen host weights for all of them (host_copy.py).
    trainer.host_copy = host_copy = share_host_copy(
        transformer, placement.streamed if train.blocks_to_swap else (), trainer.replicas, trainer.device, posted)
    trainer.runner = runner = BlockRunner(
        transformer, trainer.device, checkpointing=train.gradient_checkpointing,
        placement=placement if train.blocks_to_swap else None,
        fp8_activations=train.fp8_activations, compile_float8=train.compile_float8, host_copy=host_copy)
    notes = [runner.swapper.pinned_status if runner.swapper is not None else None, runner.fp8_status]
    if host_copy is not None and runner.swapper is None:
        notes.append(f"host copy: {host_copy.status}")
    if train.compile_float8:
        notes.append("compiled float8: on (the first step compiles)" if runner.compiled_float8
                     else "compiled float8: off here (it needs a CUDA GPU with Triton); eager path")
    trainer.memory_plan = "\n".join([trainer.memory_plan, *(n for n in notes if n is not None)])

    trainer.optimizer = build_optimizer(trainer.params, trainer.optim_cfg)
    trainer.ema = build_average(trainer.params, trainer.optim_cfg)  # from the weights now (a continued LoRA's too)
    # Samples of one micro-batch share the family's grouping key (the bucket; Edit: and the control sizes).
    trainer.order = DataOrder([components.family.batch_group(s) for s in dataset.samples], repeats=dataset.repeats,
                              batch_size=train.micro_batch_size, seed=train.seed)
    trainer.flow = FlowMatchingStep(transformer, dataset, trainer.order, train, components.scheduler_config,
                                    trainer.device, trainer.compute_dtype, components.family)
