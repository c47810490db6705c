"""Running the transformer's blocks: activation checkpointing and block swapping.

`BlockRunner` replaces each block's `forward` (an instance attribute, so module names, state dict keys
and the diffusers forward and pipeline stay untouched) with one that
  1. asks the swapper for the block's weights and to prefetch the next swapped block,
  2. runs the block, under activation checkpointing when training with it on,
  3. in training, wraps the outputs in `_BackwardMark`, whose backward runs right before the block's
     own backward (and its checkpoint recompute): there it asks for the block's weights again and
     prefetches the previous block, so backward walks the blocks in reverse with weights ready.

`BlockSwapper` keeps the frozen base Linear weights of the last `blocks_to_swap` blocks in a CPU
master copy (pinned on CUDA, packed into a `PinnedArena`) and only ever copies host-to-device, into a
ring of (at most) two GPU slots, on a side stream ordered by events. LoRA parameters, biases, norms and scales stay on the GPU. An evicted
block's weights point at an empty placeholder, so a block run without its weights fails loudly
instead of computing with another block's. On a CPU device the copies are plain synchronous copies
into the slots, which keeps the bookkeeping (and its tests) identical.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.utils.checkpoint
from torch import nn

from .models.float8 import frozen_linears

NUM_SLOTS = 2
MIB = 1 << 20
# Pinned host memory comes from torch's caching host allocator, which rounds every allocation up to a
# power of two: pinning each weight on its own would cost up to 2x (a 9 MiB weight takes 16 MiB). The
# arena packs weights into chunks whose sizes are powers of two already.
ARENA_CHUNK = 512 * MIB
ARENA_ALIGN = 512  # bytes; keeps every view aligned for any dtype and for fast DMA


def _pow2ceil(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else max(n, 1)


def arena_layout(sizes: list[int], chunk: int = ARENA_CHUNK) -> tuple[list[int], list[tuple[int, int]]]:
    """Greedy placement of `sizes` (bytes, in order) into power-of-two chunks.

    Returns (chunk capacities, (chunk index, byte offset) per size). Chunks are `chunk` bytes, except a
    tensor larger than `chunk` (its own chunk, rounded up) and the last chunk, shrunk to the power of
    two that holds what it received. Pure arithmetic: the planner uses it to predict host RAM.
    """
    caps: list[int] = []
    used: list[int] = []
    places = []
    for size in sizes:
        if size > chunk:
            caps.append(_pow2ceil(size))
            used.append(size)
            places.append((len(caps) - 1, 0))
            continue
        if not caps or caps[-1] != chunk or used[-1] + size > chunk:
            caps.append(chunk)
            used.append(0)
        offset = used[-1]
        places.append((len(caps) - 1, offset))
        used[-1] = -(-(offset + size) // ARENA_ALIGN) * ARENA_ALIGN
    if caps and caps[-1] == chunk:
        caps[-1] = min(chunk, _pow2ceil(used[-1]))
    return caps, places


class PinnedArena:
    """Host copies of tensors packed into a few (pinned) byte buffers laid out by `arena_layout`.

    Filled one tensor at a time (`store`), each chunk allocated when its first tensor arrives, so moving
    weights in (and freeing each original as soon as it is copied) never holds more than one chunk twice.
    Pinning may fail (the OS or the driver caps page-locked memory, e.g. on Windows): the chunks from
    then on are ordinary memory, `pin_error` says why, and `pinned[c]` tells each chunk's kind.
    """

    def __init__(self, specs: list[tuple[torch.Size, torch.dtype]], pin: bool):
        self.specs = list(specs)
        sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in self.specs]
        self.caps, places = arena_layout(sizes)
        self.places = places
        self.sizes = sizes
        self.chunks: list[torch.Tensor | None] = [None] * len(self.caps)
        self.pinned = [False] * len(self.caps)
        self.pin = pin
        self.pin_error: str | None = None
        self.chunk_of = [c for c, _ in places]  # arena chunk index of each tensor, in order
        self.views: list[torch.Tensor | None] = [None] * len(self.specs)

    def _chunk(self, c: int) -> torch.Tensor:
        if self.chunks[c] is None:
            if self.pin:
                try:
                    self.chunks[c] = torch.empty(self.caps[c], dtype=torch.uint8, pin_memory=True)
                    self.pinned[c] = True
                except RuntimeError as e:  # page-locked memory refused or capped: go on without it
                    self.pin, self.pin_error = False, str(e).splitlines()[0]
            if self.chunks[c] is None:
                self.chunks[c] = torch.empty(self.caps[c], dtype=torch.uint8)
        return self.chunks[c]

    def store(self, n: int, tensor: torch.Tensor) -> torch.Tensor:
        """Copy tensor `n` (of `specs`) into the arena; returns its view there."""
        shape, dtype = self.specs[n]
        c, offset = self.places[n]
        view = self._chunk(c)[offset:offset + self.sizes[n]].view(dtype).view(shape)
        view.copy_(tensor)
        self.views[n] = view
        return view

    @property
    def bytes(self) -> int:
        return sum(c.numel() for c in self.chunks if c is not None)

    @property
    def all_pinned(self) -> bool:
        return all(self.pinned[c] for c in range(len(self.chunks)) if self.chunks[c] is not None)


class BlockSwapper:
    def __init__(self, transformer: nn.Module, swapped: list[int], device: torch.device):
        self.device = device
        self.swapped = list(swapped)
        self.cuda = device.type == "cuda"
        blocks = transformer.transformer_blocks
        # Per swapped block: the frozen Linears, in a fixed order, and their CPU master weights, all in
        # one arena (pinned on CUDA so host-to-device copies are truly asynchronous).
        self.linears = {i: [m for _, m in frozen_linears(blocks[i])] for i in self.swapped}
        flat = [lin for i in self.swapped for lin in self.linears[i]]
        self.arena = PinnedArena([(lin.weight.shape, lin.weight.dtype) for lin in flat], pin=self.cuda)
        for n, lin in enumerate(flat):
            # Into the arena, and the weight points there at once: its old storage (host or device) is
            # freed before the next one is copied, so no master is ever held twice.
            lin.weight.data = self.arena.store(n, lin.weight.data)
        views = iter(self.arena.views)
        self.master = {i: [next(views) for _ in self.linears[i]] for i in self.swapped}
        # Masters in ordinary (pageable) memory cannot be copied to the GPU asynchronously: such a block goes
        # through a pinned staging buffer per slot (a host copy first, then the asynchronous upload).
        self.master_pinned = {i: all(self.arena.pinned[self.arena.chunk_of[n]] for n in self._indices(i))
                              for i in self.swapped}
        template = self.master[self.swapped[0]] if self.swapped else []
        # One slot per swapped block up to NUM_SLOTS: with a single swapped block a second slot would
        # only cost memory.
        self.num_slots = min(NUM_SLOTS, len(self.swapped))
        self.slots = [[torch.empty_like(w, device=device) for w in template] for _ in range(self.num_slots)]
        self.slot_owner: list[int | None] = [None] * self.num_slots
        self.placeholder = {w.dtype: torch.empty(0, dtype=w.dtype, device=device) for w in template}
        self.copy_stream = torch.cuda.Stream(device) if self.cuda else None
        self.copy_done: list[torch.cuda.Event | None] = [None] * self.num_slots
        self.staging: list[list[torch.Tensor] | None] = [None] * self.num_slots  # made when first needed
        for i in self.swapped:
            self._point_at_placeholder(i)
        self.bytes_copied = 0

    def _indices(self, i: int) -> range:
        """Positions of block i's weights in the arena (blocks are stored in `swapped` order)."""
        start = sum(len(self.linears[j]) for j in self.swapped[:self.swapped.index(i)])
        return range(start, start + len(self.linears[i]))

    @property
    def pinned_status(self) -> str:
        """One sentence for the status: where the swapped weights live."""
        if not self.cuda:
            return "swapped weights in host memory (CPU device: copies are plain copies)"
        if self.arena.all_pinned:
            return f"swapped weights in {self.arena.bytes / (1 << 30):.1f} GiB of pinned host memory"
        return (f"pinned host memory was refused ({self.arena.pin_error}): swapped weights are in ordinary memory and "
                "go through a small pinned staging buffer (slower copies, training works)")

    def _sources(self, slot: int, i: int) -> list[torch.Tensor]:
        """What block i's upload reads: its pinned masters, or a pinned staging copy of pageable ones."""
        if self.master_pinned[i]:
            return self.master[i]
        if self.staging[slot] is None:
            try:
                self.staging[slot] = [torch.empty_like(w, device="cpu", pin_memory=True) for w in self.master[i]]
            except RuntimeError:  # not even a staging buffer can be pinned: synchronous copies from pageable memory
                self.staging[slot] = []
        if not self.staging[slot]:
            return self.master[i]
        if self.copy_done[slot] is not None:
            self.copy_done[slot].synchronize()  # the last upload from this staging buffer has finished
        for staged, w in zip(self.staging[slot], self.master[i]):
            staged.copy_(w)
        return self.staging[slot]

    @property
    def slot_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for slot in self.slots for w in slot)

    def _slot_of(self, i: int) -> int:
        return self.swapped.index(i) % self.num_slots

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
            sources = self._sources(slot, i)
            with torch.cuda.stream(self.copy_stream):
                for dst, src in zip(self.slots[slot], sources):
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
        self.slot_owner = [None] * self.num_slots
        self.slots = []
        self.staging = [None] * self.num_slots

    def unpin(self) -> None:
        """Move the master weights into ordinary (pageable) memory and give the pinned arena back, one chunk
        at a time, so no more than one chunk is ever held twice. Call after `release`."""
        flat = [(lin, i, k) for i in self.swapped for k, lin in enumerate(self.linears[i])]
        last_user = {c: n for n, c in enumerate(self.arena.chunk_of)}  # the last tensor placed in each chunk
        for n, (lin, i, k) in enumerate(flat):
            plain = self.master[i][k].clone()  # a clone is pageable memory
            self.master[i][k] = lin.weight.data = plain
            self.arena.views[n] = None  # the last references into the chunk go with these two
            chunk = self.arena.chunk_of[n]
            if last_user[chunk] == n:
                self.arena.chunks[chunk] = None


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


def swapped_blocks(num_blocks: int, blocks_to_swap: int) -> list[int]:
    """The blocks whose frozen weights are swapped (kept in host memory, copied in when they run): the last
    `blocks_to_swap`. The loader uses this too, to read those weights straight into host memory."""
    return list(range(num_blocks - blocks_to_swap, num_blocks)) if blocks_to_swap else []


class BlockRunner:
    """Installs checkpointing and swapping on every block of `transformer` (see module docstring)."""

    def __init__(self, transformer: nn.Module, device: torch.device, blocks_to_swap: int = 0,
                 checkpointing: bool = False):
        self.transformer = transformer
        self.device = device
        self.checkpointing = checkpointing
        blocks = transformer.transformer_blocks
        n = len(blocks)
        swapped = swapped_blocks(n, blocks_to_swap)
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

    def uninstall(self, unpin: bool = False) -> None:
        """Restore the blocks' own forward and full weights. The model stays where it is: resident blocks
        on the device, swapped blocks' Linear weights on their CPU master copies (a later BlockRunner
        places everything again). `unpin`: those masters move to pageable memory, the pinned arena is freed."""
        if self.swapper is not None:
            self.swapper.release()
            if unpin:
                self.swapper.unpin()
            self.swapper = None
        for block in self.transformer.transformer_blocks:
            if _is_ours(block.forward):
                block.forward = block.forward.__wrapped_forward__


def uninstall_leftover_runner(transformer: nn.Module) -> None:
    """Uninstall a BlockRunner whose trainer was dropped without closing it (its wrappers keep it alive)."""
    forward = transformer.transformer_blocks[0].forward
    if _is_ours(forward):
        forward.func.__self__.uninstall()


def _is_ours(forward) -> bool:
    return isinstance(forward, functools.partial) and hasattr(forward, "__wrapped_forward__")

