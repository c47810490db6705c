"""Building a trainer's parts, in the order they depend on each other.

`decide`, before any weight is read: the adapter's settings (a LoRA file continued gives its rank, alpha and
modules) and the memory plan, which takes blocks_to_swap as asked or chooses it ('auto') and refuses what does not
fit. `build`: the transformer read into that placement -> the LoRA injected (or continued from the file) -> the
block runner (streaming, checkpointing, the float8 compute path) -> the optimizer and the EMA -> the data order
and the step.

The settings stay as asked. What the engine made of them is `Decided`, made once; what it built is `Built`. Both
are frozen: the parts inside change as the run trains (weights, optimizer state), never which parts they are.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from ..adapters.lora import (compute_in_input_dtype, inject_lora, matching_preset, remove_lora,
                             target_module_names)
from ..adapters.lora_files import LoraFile
from ..adapters.lora_reading import check_targets, load_into_adapter, read_lora_file
from ..core.config import NO_LORA, LoraConfig, OptimizerConfig, TrainConfig
from ..core.errors import UserInputError
from ..core.finite import all_finite
from ..data.order import DataOrder
from ..models.components import module_fingerprint
from ..models.int8_compute import store_int8
from ..planner.for_run import SwapDecision, plan_run
from ..streaming.placement import default_placement, tail_placement
from ..streaming.runner import BlockRunner, swapped_blocks
from ..streaming.shared_host import SharedHostCopy
from .comparison import Comparison
from .distributed import Replicas
from .ema import WeightAverage, build_average
from .host_copy import attach_before_load, share_host_copy
from .idle_settings import check_trainable
from .optim import build_optimizer
from .preservation import check_cached as check_preservation_cached
from .step import FlowMatchingStep


# Set on a transformer whose block weights int8 compute converted to int8 (`build`): they stay so for later runs.
INT8_HELD = "int8_compute_weights"


@dataclass(frozen=True)
class Decided:
    """What the engine decided from the settings (which stay as asked): made once, before any weight is read."""

    lora: LoraConfig  # the adapter's settings: as asked, or with the rank, alpha and targets of the LoRA file continued
    modules: tuple[str, ...]  # the adapted Linear modules
    init_lora: LoraFile | None  # the LoRA file continued (build loads its weights), or None
    swap: SwapDecision  # how many blocks stream, over how deep a ring, and why (the memory plan)

    @property
    def continued_from(self) -> Path | None:
        return self.init_lora.path if self.init_lora is not None else None


@dataclass(frozen=True)
class Built:
    """A trainer's parts, as `build` made them."""

    transformer: torch.nn.Module
    params: tuple[torch.nn.Parameter, ...]  # the adapter's trainable tensors, in the optimizer's order
    param_names: tuple[str, ...]
    runner: BlockRunner
    optimizer: torch.optim.Optimizer
    ema: WeightAverage | None  # the EMA of the weights, when on (ema.py)
    order: DataOrder
    flow: FlowMatchingStep
    host_copy: SharedHostCopy | None  # with several processes on a machine: their shared host copy (host_copy.py)
    base_fingerprint: str  # the base model as checkpoints name it, taken before the adapter joined
    accepted_base_fingerprints: frozenset[str]  # the names a checkpoint of this base model may carry (see build)
    notes: tuple[str, ...]  # the block runner's statuses, for a person (pinned memory, the float8 path, ...)


def check_inputs(components, dataset, train) -> None:
    """What the Trainer refuses before it builds anything: settings that do not fit the model, an empty cached
    dataset or one no step could learn from, preservation without the class captions it needs (preservation.py).
    The settings themselves were checked when made; this is the one check of them against the model."""
    train.check_model(num_blocks=components.num_blocks)
    if not dataset.samples:
        raise UserInputError("the cached dataset has no samples: check the Dataset node's folder.")
    check_trainable(dataset.samples)  # some image must weigh, and some must be the subject (idle_settings.py)
    check_preservation_cached(dataset.samples, train.preservation_weight)


def decide(components, dataset, lora: LoraConfig, optimizer: OptimizerConfig, train: TrainConfig,
           init_lora: str | Path | None, preview_size: tuple[int, int] | None, processes: int) -> Decided:
    """The adapter's settings and the blocks' placement, from the settings, the model's skeleton and the LoRA file
    `init_lora` (None: a new LoRA). `processes`: the run's processes on this machine (the memory plan's RAM)."""
    components.family.check_cached(dataset)  # a cache another kind of family made: refused before anything loads
    skeleton = components.skeleton()  # module names and shapes; the weights may not be read yet
    file = modules = None
    if init_lora is not None:
        if lora.adapter != "lora":
            raise UserInputError(f"continue_from_lora starts from a plain LoRA file, and the LoRA Config asks for "
                                 f"adapter={lora.adapter}: set adapter to lora to continue that file, or choose "
                                 f"{NO_LORA!r} to train a new LoKr or LoHa.")
        file = read_lora_file(init_lora, model=skeleton)  # kohya names and fused Linears: this model's
        check_targets(skeleton, file)
        modules = file.targets
        # The file decides rank, alpha and the adapted modules; dropout and dtype come from the settings.
        lora = dataclasses.replace(lora, rank=file.rank, alpha=file.alpha,
                                   targets=matching_preset(skeleton, modules) or lora.targets)
    # blocks_to_swap as asked, or 'auto' made a number: the memory plan at the dataset's largest bucket (against the
    # device's free memory now: free other models first), which refuses a run whose phases would not fit.
    swap = plan_run(components, dataset, lora, optimizer, train, preview_size, processes=processes)
    return Decided(lora, tuple(modules or target_module_names(skeleton, lora.targets)), file, swap)


def build(components, dataset, decided: Decided, optimizer_cfg: OptimizerConfig, train: TrainConfig,
          replicas: Replicas, comparison: Comparison, keeps_checkpoints: bool) -> Built:
    """The trainer's parts on `components`' transformer, as `decided`. On failure the transformer is given back
    without a half-made adapter or runner (nobody else holds these parts to undo them)."""
    device, lora, swap = components.device, decided.lora, decided.swap
    base_fingerprint = components.fingerprint("transformer")  # before the adapter joins the model
    # A lazy model set reads the transformer now, straight into this placement. A process that is not its machine's
    # first takes the frozen host weights from the machine's shared copy instead of the file (host_copy.py).
    posted = attach_before_load(replicas) if components.streams_transformer else None
    transformer = components.ensure_transformer(
        device, host_blocks=swapped_blocks(components.num_blocks, swap.blocks_to_swap),
        given=posted.given if posted is not None else None)
    # Checkpoints name the base model they were trained on. A model set read from files names it by its
    # file's identity; checkpoints written when every model set was named by its weights are still continued:
    # their name is the weights' fingerprint, taken here before the adapter joins.
    accepted = {base_fingerprint}
    if components.transformer_source is not None and keeps_checkpoints:
        accepted.add(module_fingerprint(transformer))

    # int8 compute: the block weights held in int8 (rotated, per-row scales) before the adapter, the host copy and the
    # runner see them, so streamed blocks stream their int8 bytes. In place, on the loaded model set: it stays int8.
    converted = store_int8(transformer) if train.int8_compute else 0
    if converted:
        transformer.__dict__[INT8_HELD] = True
    runner = None
    try:
        params = tuple(inject_lora(transformer, lora, seed=train.seed, modules=list(decided.modules)))
        # LoRA matmuls in the compute dtype, fp32 weights and updates (a comparison may ask for peft's fp32 cast)
        compute_in_input_dtype(transformer, enabled=comparison.lora_compute == "compute dtype")
        if decided.init_lora is not None:
            load_into_adapter(transformer, decided.init_lora.weights)
            if not all_finite(params):  # finite in the file, but not once cast (float64 beyond float32's range)
                raise UserInputError(
                    f"LoRA file {decided.init_lora.path} holds values too large for LoRA dtype {lora.dtype}: they "
                    "become inf. Choose another LoRA file.")
        param_names = tuple(n for n, p in transformer.named_parameters() if p.requires_grad)

        place = tail_placement if comparison.placement == "tail" else default_placement
        placement = place(components.num_blocks, swap.blocks_to_swap, swap.ring_depth)
        # Several processes on a machine: one host copy of the frozen host weights for all of them (host_copy.py).
        host_copy = share_host_copy(
            transformer, placement.streamed if swap.blocks_to_swap else (), replicas, device, posted)
        runner = BlockRunner(
            transformer, device, checkpointing=train.checkpointing, checkpointed_blocks=swap.checkpointed_blocks,
            placement=placement if swap.blocks_to_swap else None,
            fp8_activations=train.fp8_activations, compile_float8=train.compile_float8, host_copy=host_copy,
            int8_compute=train.int8_compute, fused_blocks=train.fused_blocks,
            attention=train.attention_backend)
        notes = [runner.swapper.pinned_status if runner.swapper is not None else None, runner.fp8_status,
                 runner.fused_status,
                 getattr(components.transformer_source, "runtime_note", None),  # the file's attention preferences
                 decided.init_lora.runtime_note if decided.init_lora is not None else None]
        if converted:
            notes.append(f"int8 compute: {converted} block weights rotated and quantised to int8 at load")
        if not train.int8_compute and transformer.__dict__.get(INT8_HELD):
            notes.append("the block weights are still held in int8 from an earlier int8_compute run of this model "
                         "set (computed in the compute dtype now): reload the model to train on its own storage")
        if host_copy is not None and runner.swapper is None:
            notes.append(f"host copy: {host_copy.status}")
        if train.compile_float8:
            notes.append(("compiled float8: on (experimental; the first step compiles; measured slower than the eager path on an "
                          "H100: 1.54 against 1.06 s a step)") if runner.compiled_float8
                         else "compiled float8: off here (it needs a CUDA GPU with Triton); eager path")

        optimizer = build_optimizer(list(params), optimizer_cfg)
        ema = build_average(list(params), optimizer_cfg)  # from the weights now (a continued LoRA's too)
        # Samples of one micro-batch share the family's grouping key (the bucket; Edit: and the control sizes).
        order = DataOrder([components.family.batch_group(s) for s in dataset.samples], repeats=dataset.repeats,
                          batch_size=train.micro_batch_size, seed=train.seed)
        flow = FlowMatchingStep(transformer, dataset, order, train, components.scheduler_config, device,
                                components.compute_dtype, components.family)
    except BaseException:
        if runner is not None:
            runner.uninstall()
        remove_lora(transformer)
        raise
    return Built(transformer, params, param_names, runner, optimizer, ema, order, flow, host_copy, base_fingerprint,
                 frozenset(accepted), tuple(n for n in notes if n is not None))
