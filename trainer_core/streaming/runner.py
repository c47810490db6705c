"""Running the transformer's blocks in training: the block runner installs itself on every block and walks
both passes, calling on one part per concern.

`BlockRunner` replaces each block's `forward` (`forwards.wrap`) with one that, at block i
  1. has the swapper issue the copies the ring policy asks for and wait for block i's own weights
     (`swapper.BlockSwapper`, `placement.Ring`),
  2. runs the block, under activation checkpointing when training with it on (`checkpointing`),
  3. in training, marks the outputs so that step 1 happens again for the backward pass, right before the
     block's own backward and its checkpoint recompute; backward walks the blocks in reverse.
It also routes every modulation Linear through `modulation_outputs.ModulationOutputs` (the recompute takes the
forward's outputs; planned training forwards take outputs computed ahead, `plan_modulation`), installs one
float8 compute path on the frozen block Linears (`models.float8.paths`), and records the step's events when
asked (`trace.Trace`). In the last block the text stream's output is thrown away by the model, so it leaves
the graph there (detached) and its backward never runs on zero gradients.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..adapters import fused_lora as fused_lora_adds
from ..core.host_memory import give_back_freed_memory
from ..models import attention_backend, fused_block
from ..models.float8 import frozen_linears
from ..models.float8.paths import COMPILED, compute_path, path_name
from ..models.modulation import is_modulation_linear, supports_modulation_ahead
from . import forwards
from .checkpointing import checkpointed, marked_for_backward, without_dead_text_stream
from .modulation_outputs import ModulationOutputs
from .placement import BACKWARD, FORWARD, Placement, default_placement
from .swapper import BlockSwapper
from .trace import Trace


class BlockRunner:
    """Installs checkpointing, swapping, the modulation outputs and a float8 compute path on every block of
    `transformer` (see the module docstring). `placement` says which blocks are streamed and how deep the ring
    is; by default `blocks_to_swap` blocks spread over the depth (`placement.default_placement`). A runner
    still installed on the model (one dropped without `uninstall`) is uninstalled first: one runner per model."""

    def __init__(self, transformer: nn.Module, device: torch.device, blocks_to_swap: int = 0,
                 checkpointing: bool = False, placement: Placement | None = None, compile_float8: bool = False,
                 fp8_activations: bool = False, compile_on_cpu: bool = False, host_copy=None,
                 int8_compute: bool = False, fused_blocks: str = fused_block.AUTO,
                 attention: str = attention_backend.AUTO, checkpointed_blocks: int | None = None,
                 fused_lora: bool = False):
        """`compile_float8`: the frozen block Linears compiled so float8 weights are multiplied without a bf16
        copy (`models.float8.compiled`; CUDA + Triton, ignored where unavailable, `compiled_float8` says whether
        it is on). `compile_on_cpu`: on the CPU too (tests, benchmarks; off by default, see that module).
        `fp8_activations`: the float8 block Linears multiply in float8 with `torch._scaled_mm`
        (`models.float8.activations`; where the device runs it, else the eager path); `fp8_status` says which.
        `int8_compute`: the int8-held block Linears multiply int8 activations with `torch._int_mm`
        (`models.int8_compute`; the weights converted before, `int8_compute.store_int8`). The three are
        alternatives: asking for two is refused. `host_copy`: the machine's shared host copy
        (`shared_host.SharedHostCopy`) that holds the streamed blocks' masters already, or None.
        `fused_blocks` (`models.fused_block.FUSED_MODES`) and `attention` (`models.attention_backend.BACKENDS`):
        our block forward and joint attention on the Qwen-Image 1.x blocks (`fused_status` says what runs;
        `compile_on_cpu` also lets fused_blocks='compiled' compile on the CPU).
        `checkpointed_blocks`: with `checkpointing`, only blocks 0 .. checkpointed_blocks - 1 recompute in backward
        (the others keep their activations: faster, more memory; planner.search.auto_checkpointed_blocks picks the
        fewest that fit); None: every block. Only without streamed blocks, whose schedule assumes every block
        recomputes.
        `fused_lora`: the blocks' plain LoRA Linears add their LoRA in place into the frozen Linear's output, A and
        B cast once per change (`adapters.fused_lora`; the same values as peft's forward, see tests/engine/
        test_fused_lora.py); False (the default): peft's own forward. Off until the plan counts its cast copies of
        A and B (a bf16 copy of every LoRA weight kept between steps: the tiny model's step peak ran 3.4% over the
        plan with it on) and a GPU has measured it; CAME with bf16 LoRA weights did not resume bit for bit with it."""
        path = compute_path(path_name(compile_float8, fp8_activations, int8_compute), allow_cpu=compile_on_cpu)
        uninstall_leftover_runner(transformer)
        self.transformer = transformer
        self.device = device
        self.checkpointing = checkpointing
        blocks = transformer.transformer_blocks
        if checkpointed_blocks is not None and not 0 <= checkpointed_blocks <= len(blocks):
            raise ValueError(f"checkpointed_blocks {checkpointed_blocks}: between 0 and {len(blocks)} blocks")
        # Blocks 0 .. checkpoint_depth - 1 recompute (all of them by default, none without checkpointing).
        self.checkpoint_depth = (0 if not checkpointing else len(blocks) if checkpointed_blocks is None
                                 else checkpointed_blocks)
        if placement is None and blocks_to_swap:
            placement = default_placement(len(blocks), blocks_to_swap)
        self.placement = placement if placement is not None and placement.streamed else None
        if checkpointed_blocks is not None and checkpointed_blocks < len(blocks) and self.placement is not None:
            raise ValueError("checkpointed_blocks: only with every block resident (no block streamed)")
        swapped = list(self.placement.streamed) if self.placement else []
        self._place(swapped)
        self.trace: Trace | None = None
        self.swapper = BlockSwapper(blocks, self.placement, device, shared=host_copy) if swapped else None
        # What the placement and the swapper's arena replaced (a previous run's arena, host copies of blocks now on the
        # device) is freed but cached: given back, so a re-init starts from the plan's figure, not the last run's.
        give_back_freed_memory(pinned=True)
        self.modulation = ModulationOutputs(transformer, set(swapped))
        self.float8 = path.install([lin for block in blocks for _, lin in frozen_linears(block)], device)
        self.fused_lora_layers = fused_lora_adds.install(blocks) if fused_lora else []
        # Before the block wrappers below: they call the forward this puts on the blocks.
        self.fused = fused_block.install(blocks, fused_blocks, attention_backend.choose_for(attention, device),
                                         device, allow_cpu_compile=compile_on_cpu)
        # After the float8 path: the modulation wrappers call the forward it installed.
        for i, block in enumerate(blocks):
            block.forward = forwards.wrap(block.forward, functools.partial(self._run_block, i), self)
            for name, lin in frozen_linears(block):
                if is_modulation_linear(name):
                    key = (i, name.removesuffix(".base_layer"))  # peft's wrapper adds .base_layer
                    lin.forward = forwards.wrap(lin.forward, functools.partial(self.modulation.output, key), self)

    @property
    def fp8_status(self) -> str | None:
        """One line on fp8 activations or int8 compute for the run's status when asked for, else None."""
        return self.float8.status

    @property
    def fused_status(self) -> str:
        """One line for the run's status: the fused block mode and the attention backend that run."""
        return self.fused.status

    @property
    def compiled_float8(self) -> bool:
        """Whether the frozen block Linears run through the compiled expression (`models.float8.compiled`)."""
        return self.float8.name == COMPILED

    @property
    def forwards_from_plan(self) -> int:
        """Training forwards that took their streamed blocks' modulation outputs from a plan."""
        return self.modulation.forwards_from_plan

    def record(self) -> Trace:
        """Start recording the step's events (`trace`): the list that fills."""
        self.trace = Trace()
        if self.swapper is not None:
            self.swapper.trace = self.trace
        return self.trace

    def _place(self, swapped: list[int]) -> None:
        """Move everything to the device except the frozen Linear weights of swapped blocks."""
        blocks = self.transformer.transformer_blocks
        kept_on_cpu = {}
        for i in swapped:
            for _, lin in frozen_linears(blocks[i]):
                kept_on_cpu[lin] = lin.weight.data
                lin.weight.data = torch.empty(0, dtype=lin.weight.dtype)
        self.transformer.to(self.device)
        for lin, w in kept_on_cpu.items():
            lin.weight.data = w

    def _start(self, pass_: str, i: int) -> None:
        """Right before block i runs in `pass_`."""
        self.modulation.phase = pass_
        if self.swapper is not None:
            self.swapper.before(pass_, i)
        if self.trace is not None:
            self.trace.compute(i, pass_)

    def plan_modulation(self, timesteps: list[torch.Tensor]) -> bool:
        """The timesteps (B,), as the transformer receives them, of the next training forwards, in order: the
        first computes the streamed blocks' modulation outputs for all of them, the others copy those blocks
        without their modulation weights. False (and nothing planned) where it does not apply: no block
        streamed, no checkpointing, or modulation inputs that are not a function of the timestep alone."""
        self.forget_modulation()
        if self.swapper is None or not self.checkpointing or not supports_modulation_ahead(self.transformer):
            return False
        self.modulation.plan(timesteps)
        return True

    def forget_modulation(self) -> None:
        """Drop what was planned or computed ahead (the trainer's draws changed: a resume, an interruption)."""
        self.modulation.forget()
        if self.swapper is not None:
            self.swapper.ring.forward_needs_modulation = self.swapper.ring.next_forward_needs_modulation = True

    @property
    def planned_forwards(self) -> int:
        """Training forwards planned or computed ahead and not begun yet."""
        return self.modulation.planned_forwards

    def _run_block(self, i: int, forward, *args, **kwargs):
        """Block i's forward in place of its own: `forward` is the block's; outputs (text, image)."""
        training = torch.is_grad_enabled()
        if i == 0:  # the ring learns what this forward and the next one need of the streamed blocks
            now, next_ = self.modulation.begin_forward(training and self.checkpointing)
            if self.swapper is not None:
                self.swapper.ring.forward_needs_modulation = now
                self.swapper.ring.next_forward_needs_modulation = next_
        self._start(FORWARD, i)
        if training and i < self.checkpoint_depth:
            self.modulation.caching = True
            try:
                outputs = checkpointed(forward, *args, **kwargs)
            finally:
                self.modulation.caching = False
        else:
            outputs = forward(*args, **kwargs)
        if not training:
            return outputs
        if isinstance(outputs, torch.Tensor):  # a single-stream block (Qwen-Image 2.1): one joint sequence
            return marked_for_backward((outputs,), functools.partial(self._start, BACKWARD, i))[0]
        if i == len(self.transformer.transformer_blocks) - 1:
            outputs = without_dead_text_stream(outputs)
        return marked_for_backward(outputs, functools.partial(self._start, BACKWARD, i))

    def uninstall(self, unpin: bool = False) -> None:
        """Restore the blocks' own forward and full weights. The model stays where it is: resident blocks
        on the device, swapped blocks' Linear weights on their CPU master copies (a later BlockRunner
        places everything again). `unpin`: those masters move to pageable memory, the pinned arena is freed."""
        if self.swapper is not None:
            self.swapper.release()
            if unpin:
                self.swapper.unpin()
            self.swapper = None
        self.modulation.clear()
        fused_lora_adds.uninstall(self.fused_lora_layers)
        self.fused_lora_layers = []
        self.float8.uninstall()  # before unwrapping: it gives the modulation Linears their eager forward back
        for block in self.transformer.transformer_blocks:
            forwards.unwrap(block)
            for _, lin in frozen_linears(block):
                forwards.unwrap(lin)
        self.fused.uninstall()  # after unwrapping: the blocks' own forward back (the wrappers held ours)


def swapped_blocks(num_blocks: int, blocks_to_swap: int) -> list[int]:
    """The blocks whose frozen weights are streamed by default for `blocks_to_swap` (spread over the depth,
    `placement.default_placement`). The loader reads those weights straight into host memory."""
    return list(default_placement(num_blocks, blocks_to_swap).streamed) if blocks_to_swap else []


def uninstall_leftover_runner(transformer: nn.Module) -> None:
    """Uninstall every BlockRunner still installed on `transformer`: one whose trainer was dropped without
    closing it, found through any block's wrappers (`forwards.installed_runners`)."""
    for runner in forwards.installed_runners(transformer):
        runner.uninstall()
