"""Running the transformer's blocks: activation checkpointing and block swapping.

`BlockRunner` replaces each block's `forward` (an instance attribute, so module names, state dict keys
and the diffusers forward and pipeline stay untouched) with one that
  1. asks the swapper for the block's weights and to prefetch the next swapped block,
  2. runs the block, under activation checkpointing when training with it on,
  3. in training, wraps the outputs in `_BackwardMark`, whose backward runs right before the block's
     own backward (and its checkpoint recompute): there it asks for the block's weights again and
     prefetches the previous block, so backward walks the blocks in reverse with weights ready.

`BlockSwapper` keeps the frozen base Linear weights of the last `blocks_to_swap` blocks in a CPU
master copy (pinned on CUDA) and only ever copies host-to-device, into a ring of two GPU slots, on a
side stream ordered by events. LoRA parameters, biases, norms and scales stay on the GPU. An evicted
block's weights point at an empty placeholder, so a block run without its weights fails loudly
instead of computing with another block's. On a CPU device the copies are plain synchronous copies
into the slots, which keeps the bookkeeping (and its tests) identical.
"""

from __future__ import annotations

import functools

import torch
import torch.utils.checkpoint
from torch import nn

from .models.float8 import frozen_linears

NUM_SLOTS = 2


class BlockSwapper:
    def __init__(self, transformer: nn.Module, swapped: list[int], device: torch.device):
        self.device = device
        self.swapped = list(swapped)
        self.cuda = device.type == "cuda"
        blocks = transformer.transformer_blocks
        # Per swapped block: the frozen Linears, in a fixed order, and their CPU master weights.
        self.linears: dict[int, list[nn.Linear]] = {}
        self.master: dict[int, list[torch.Tensor]] = {}
        for i in self.swapped:
            linears = [m for _, m in frozen_linears(blocks[i])]
            self.linears[i] = linears
            masters = []
            for lin in linears:
                w = lin.weight.data.to("cpu")
                # CPU: the slots are separate buffers already, so the weight itself can be the master.
                masters.append(w.pin_memory() if self.cuda else w)
            self.master[i] = masters
        template = self.master[self.swapped[0]] if self.swapped else []
        self.slots = [[torch.empty_like(w, device=device) for w in template] for _ in range(NUM_SLOTS)]
        self.slot_owner: list[int | None] = [None] * NUM_SLOTS
        self.placeholder = {w.dtype: torch.empty(0, dtype=w.dtype, device=device) for w in template}
        self.copy_stream = torch.cuda.Stream(device) if self.cuda else None
        self.copy_done: list[torch.cuda.Event | None] = [None] * NUM_SLOTS
        for i in self.swapped:
            self._point_at_placeholder(i)
        self.bytes_copied = 0

    @property
    def slot_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for slot in self.slots for w in slot)

    def _slot_of(self, i: int) -> int:
        return self.swapped.index(i) % NUM_SLOTS

    def _point_at_placeholder(self, i: int) -> None:
        for lin in self.linears[i]:
            lin.weight.data = self.placeholder[lin.weight.dtype]

    def _load(self, i: int) -> None:
        """Start copying block i's weights into its slot (evicting the slot's owner)."""
        slot = self._slot_of(i)
        owner = self.slot_owner[slot]
        if owner == i:
            return
        if owner is not None:
            self._point_at_placeholder(owner)
        if self.cuda:
            # The compute stream may still be reading the slot (the owner's kernels): wait for it.
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.copy_stream):
                for dst, src in zip(self.slots[slot], self.master[i]):
                    dst.copy_(src, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.copy_stream)
            self.copy_done[slot] = event
        else:
            for dst, src in zip(self.slots[slot], self.master[i]):
                dst.copy_(src)
        for lin, dst in zip(self.linears[i], self.slots[slot]):
            lin.weight.data = dst
        self.slot_owner[slot] = i
        self.bytes_copied += sum(w.numel() * w.element_size() for w in self.master[i])

    def ensure(self, i: int) -> None:
        """Block i's weights are ready for the compute stream when this returns."""
        if i not in self.master:
            return
        self._load(i)
        slot = self._slot_of(i)
        if self.cuda and self.copy_done[slot] is not None:
            torch.cuda.current_stream(self.device).wait_event(self.copy_done[slot])

    def prefetch(self, i: int) -> None:
        if i in self.master:
            self._load(i)

    def prefetch_after(self, i: int) -> None:
        """Start loading the first swapped block after block i. When i itself is resident, the slot that
        block needs holds a block that already ran in this pass, so overwriting it is safe; this hides
        the first swapped block's copy behind the resident blocks' compute."""
        later = [j for j in self.swapped if j > i]
        if later:
            self._load(later[0])

    def release(self) -> None:
        """Point every swapped block back at its master weights (for saving or moving the model)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.copy_stream)
        for i in self.swapped:
            for lin, w in zip(self.linears[i], self.master[i]):
                lin.weight.data = w
        self.slot_owner = [None] * NUM_SLOTS


class _BackwardMark(torch.autograd.Function):
    """Identity whose backward calls `before_backward()` before gradients enter the block."""

    @staticmethod
    def forward(ctx, before_backward, *outputs):
        ctx.before_backward = before_backward
        return tuple(o.view_as(o) for o in outputs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.before_backward()
        return (None, *grads)


class BlockRunner:
    """Installs checkpointing and swapping on every block of `transformer` (see module docstring)."""

    def __init__(self, transformer: nn.Module, device: torch.device, blocks_to_swap: int = 0,
                 checkpointing: bool = False):
        self.transformer = transformer
        self.device = device
        self.checkpointing = checkpointing
        blocks = transformer.transformer_blocks
        n = len(blocks)
        swapped = list(range(n - blocks_to_swap, n)) if blocks_to_swap else []
        self._place(swapped)
        self.swapper = BlockSwapper(transformer, swapped, device) if swapped else None
        for i, block in enumerate(blocks):
            original = block.forward.__wrapped_forward__ if _is_ours(block.forward) else block.forward
            wrapped = functools.partial(self._run_block, i, original)
            wrapped.__wrapped_forward__ = original
            block.forward = wrapped

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

    def _run_block(self, i: int, forward, *args, **kwargs):
        swapper = self.swapper
        if swapper is not None:
            swapper.ensure(i)
            swapper.prefetch_after(i)
        if self.checkpointing and torch.is_grad_enabled():
            outputs = torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
        else:
            outputs = forward(*args, **kwargs)
        if swapper is not None and torch.is_grad_enabled():
            def before_backward():
                swapper.ensure(i)
                swapper.prefetch(i - 1)
            outputs = _BackwardMark.apply(before_backward, *outputs)
        return outputs

    def uninstall(self) -> None:
        """Restore the blocks' own forward and full weights (the model stays on the device)."""
        if self.swapper is not None:
            self.swapper.release()
        for block in self.transformer.transformer_blocks:
            if _is_ours(block.forward):
                block.forward = block.forward.__wrapped_forward__


def _is_ours(forward) -> bool:
    return isinstance(forward, functools.partial) and hasattr(forward, "__wrapped_forward__")

