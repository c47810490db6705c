"""The swapper: streamed blocks' frozen base Linear weights in a host master copy, copied host-to-device only.

`BlockSwapper` keeps the frozen base Linear weights of the streamed blocks (`placement.Placement`: which blocks,
how deep the ring) in a CPU master copy, one contiguous blob per block (pinned on CUDA, packed into a
`arena.PinnedArena`), and only ever copies host-to-device, one contiguous range per copy, into a ring of GPU
slots, on a side stream ordered by events: the frozen weights never change, so nothing is copied back. LoRA
parameters, biases, norms and scales stay on the GPU. An evicted block's weights point at an empty
placeholder, so a block run without its weights fails loudly instead of computing with another block's. On a
CPU device the copies are plain synchronous copies into the slots, which keeps the bookkeeping (and its tests)
identical. Which copy is issued when is `placement.Ring`'s policy; the block runner calls `before` at every
block of both passes.
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.errors import UserInputError
from ..models.float8 import frozen_linears, mark_weight_moves
from ..models.modulation import is_modulation_linear
from ..core.host_memory import give_back_freed_memory
from .arena import PinnedArena, blob_arena_layout
from .placement import BACKWARD_PART, Load, Placement, Ring, blob_layout
from .trace import Trace


def _stored(layout: list[tuple[tuple[int, ...], torch.dtype]]) -> str:
    """The dtypes of a block's frozen weights, for a person ("float8_e4m3fn", "bfloat16 and float8_e4m3fn")."""
    return " and ".join(sorted({str(dtype).removeprefix("torch.") for _, dtype in layout}))


class BlockSwapper:
    """The streamed blocks' weights (module docstring). `before(pass_, i)` at every block; `release()` points
    every streamed Linear back at its master (the runner's uninstall), `unpin()` then moves the masters to
    pageable memory; `bytes_copied`, `slot_bytes` and `pinned_status` for tests and the run's status."""

    def __init__(self, blocks, placement: Placement, device: torch.device,
                 trace: Trace | None = None, shared=None):
        """`blocks`: the modules streamed by index (the transformer's `transformer_blocks`; a text encoder's decoder
        layers or vision blocks, `layers.LayerStreamer`). Every streamed block's frozen Linears must have the same
        shapes and dtypes (one blob layout serves them all). `shared`: a `shared_host.SharedHostCopy` whose blobs hold
        these blocks' weights already (the machine's one host copy, which the Linears point at): copies read from it
        and no arena is made."""
        self.device = device
        self.placement = placement
        self.swapped = list(placement.streamed)
        self.cuda = device.type == "cuda"
        self.trace = trace  # when a Trace: the copies and waits, in issue order
        # Per swapped block: the frozen Linears, in a fixed order, and their CPU master weights, each block one
        # blob (backward part first, modulation Linears last) in one arena, pinned on CUDA so host-to-device
        # copies are truly asynchronous.
        named = {i: frozen_linears(blocks[i]) for i in self.swapped}
        self.linears = {i: [m for _, m in named[i]] for i in self.swapped}
        flat = [lin for i in self.swapped for lin in self.linears[i]]
        for lin in flat:  # their weights point at ring slots that later blocks reuse: read again at backward
            mark_weight_moves(lin, True)
        first = self.swapped[0]
        self._check_same_layout(first)
        sizes = [lin.weight.numel() * lin.weight.element_size() for lin in self.linears[first]]
        self.forward_only = [is_modulation_linear(name) for name, _ in named[first]]
        self.blob = blob_layout(sizes, self.forward_only)
        self.shared = shared if shared is not None and shared.covers(self.swapped) else None
        if self.shared is not None:
            self._use_shared()
        else:
            self._fill_arena(flat, sizes)
        template = self.master[first]
        self.slot_buffers = [torch.empty(self.blob.whole_bytes, dtype=torch.uint8, device=device)
                             for _ in range(placement.slots)]
        # Per slot, its Linear weights: views into the slot's bytes at the blob's offsets.
        self.slots = [[buf[o:o + w.numel() * w.element_size()].view(w.dtype).view(w.shape)
                       for o, w in zip(self.blob.offsets, template)] for buf in self.slot_buffers]
        self.ring = Ring(placement)
        self.slot_owner: list[int | None] = [None] * placement.slots
        self.placeholder = {w.dtype: torch.empty(0, dtype=w.dtype, device=device) for w in template}
        self.copy_stream = torch.cuda.Stream(device) if self.cuda else None
        self.copy_done: list[torch.cuda.Event | None] = [None] * placement.slots
        self.staging: list[torch.Tensor | None] = [None] * placement.slots  # made when first needed
        for i in self.swapped:
            self._point_at_placeholder(i)
        self.bytes_copied = 0

    def _check_same_layout(self, first: int) -> None:
        """Refuse blocks whose frozen weights differ from the first streamed block's (a file that quantises some blocks
        and not others): their bytes would be read through the first block's views."""
        want = [(tuple(lin.weight.shape), lin.weight.dtype) for lin in self.linears[first]]
        for i in self.swapped:
            got = [(tuple(lin.weight.shape), lin.weight.dtype) for lin in self.linears[i]]
            if got != want:
                kinds = _stored(want), _stored(got)
                raise UserInputError(
                    f"blocks_to_swap: the transformer's blocks are stored differently (block {first}'s Linears in "
                    f"{kinds[0]}, block {i}'s in {kinds[1]}{'' if kinds[0] != kinds[1] else ', other shapes'}), "
                    "as a file that quantises some blocks and not others holds them; streamed blocks share one ring of "
                    "GPU slots, so they must be stored alike. Set blocks_to_swap to 0 where the model fits, or load a "
                    "transformer file quantised throughout (ComfyUI's fp8_e4m3fn file, say). Nothing was trained yet.")

    def _fill_arena(self, flat: list[nn.Linear], sizes: list[int]) -> None:
        """The masters into this process's own (pinned) arena; each block's blob one byte range of a chunk."""
        layout = blob_arena_layout(self.blob, sizes, len(self.swapped))
        self.arena = PinnedArena([(lin.weight.shape, lin.weight.dtype) for lin in flat], pin=self.cuda, layout=layout)
        for n, lin in enumerate(flat):
            # Into the arena, and the weight points there at once: its old storage (host or device) is
            # freed before the next one is copied, so no master is ever held twice.
            lin.weight.data = self.arena.store(n, lin.weight.data)
        views = iter(self.arena.views)
        self.master = {i: [next(views) for _ in self.linears[i]] for i in self.swapped}
        # Each block's blob as one byte range of its chunk: what a copy reads.
        self.regions = {}
        self.region_pinned = {}  # pageable blobs go through a pinned staging buffer (see _source)
        for n, i in enumerate(self.swapped):
            chunk, offset = layout[1][n * len(sizes)]
            start = offset - self.blob.offsets[0]
            self.regions[i] = self.arena.chunks[chunk][start:start + self.blob.whole_bytes]
            self.region_pinned[i] = self.arena.pinned[chunk]

    def _use_shared(self) -> None:
        """The masters are the machine's shared host copy already: each block's blob is a range of it."""
        self.arena = None
        if self.shared.layout.blob != self.blob:
            raise RuntimeError(f"the shared host copy's blob layout {self.shared.layout.blob} is not {self.blob}")
        self.master = {i: [lin.weight.data for lin in self.linears[i]] for i in self.swapped}
        self.regions = {i: self.shared.blob(i) for i in self.swapped}
        self.region_pinned = {i: self.shared.pinned for i in self.swapped}
        for i in self.swapped:  # the Linears point into their blob, where the copies read
            for w, offset in zip(self.master[i], self.blob.offsets):
                if w.data_ptr() != self.regions[i][offset:].data_ptr():
                    raise RuntimeError(f"block {i}: a weight is not in its blob of the shared host copy")

    @property
    def slot_bytes(self) -> int:
        return sum(buf.numel() for buf in self.slot_buffers)

    @property
    def pinned_status(self) -> str:
        """One sentence for the status: where the streamed blocks' weights live."""
        if self.shared is not None:
            return f"streamed blocks' weights in the machine's shared host copy: {self.shared.status}"
        if not self.cuda:
            return "streamed blocks' weights in host memory (CPU device: copies are plain copies)"
        if self.arena.all_pinned:
            return f"streamed blocks' weights in {self.arena.bytes / (1 << 30):.1f} GiB of pinned host memory"
        return (f"pinned host memory was refused ({self.arena.pin_error}): streamed weights are in ordinary memory and "
                "go through a small pinned staging buffer (slower copies, training works)")

    def _source(self, slot: int, block: int, start: int, end: int) -> torch.Tensor:
        """What an upload of bytes [start, end) of `block`'s blob reads: the pinned blob itself, or, for a blob in
        pageable memory, a pinned staging copy (an asynchronous upload needs page-locked memory)."""
        src = self.regions[block][start:end]
        if self.region_pinned[block]:
            return src
        if self.staging[slot] is None:
            try:
                self.staging[slot] = torch.empty(self.blob.whole_bytes, dtype=torch.uint8, pin_memory=True)
            except RuntimeError:  # not even a staging buffer can be pinned: copy from pageable memory
                self.staging[slot] = torch.empty(0, dtype=torch.uint8)
        if not self.staging[slot].numel():
            return src
        if self.copy_done[slot] is not None:
            self.copy_done[slot].synchronize()  # the last upload from this staging buffer has finished
        staged = self.staging[slot][start:end]
        staged.copy_(src)
        return staged

    def _point_at_placeholder(self, i: int) -> None:
        for lin in self.linears[i]:
            lin.weight.data = self.placeholder[lin.weight.dtype]

    def _issue(self, load: Load) -> None:
        """Copy the byte range `load` needs (one contiguous copy) and point the block's Linears at the slot."""
        owner = self.slot_owner[load.slot]
        if owner is not None and owner != load.block:
            self._point_at_placeholder(owner)
        start, end = load.byte_range(self.blob)
        src, dst = self.regions[load.block][start:end], self.slot_buffers[load.slot][start:end]
        if self.cuda:
            src = self._source(load.slot, load.block, start, end)
            # The compute stream may still be reading the slot (the owner's kernels): wait for it.
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.copy_stream):
                dst.copy_(src, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.copy_stream)
            self.copy_done[load.slot] = event
        else:
            dst.copy_(src)
        whole = load.part != BACKWARD_PART
        for lin, view, forward_only in zip(self.linears[load.block], self.slots[load.slot], self.forward_only):
            lin.weight.data = view if whole or not forward_only else self.placeholder[view.dtype]
        self.slot_owner[load.slot] = load.block
        self.bytes_copied += end - start
        if self.trace is not None:
            self.trace.copy(load.block, end - start)

    def before(self, pass_: str, i: int) -> None:
        """Right before block i runs in `pass_` (placement.FORWARD or BACKWARD): issue the copies the ring
        policy asks for and make the compute stream wait for block i's weights."""
        ensure, ahead = self.ring.loads_at(pass_, i)
        if ensure is not None:
            self._issue(ensure)
        if i in self.master:
            slot = self.placement.slot(i)
            if self.cuda and self.copy_done[slot] is not None:
                torch.cuda.current_stream(self.device).wait_event(self.copy_done[slot])
            if self.trace is not None:
                self.trace.wait(i)
        for load in ahead:
            self._issue(load)

    def release(self) -> None:
        """Point every swapped block back at its master weights (for saving or moving the model)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.copy_stream)
        for i in self.swapped:
            for lin, w in zip(self.linears[i], self.master[i]):
                lin.weight.data = w
                mark_weight_moves(lin, False)
        self.slot_owner = [None] * self.placement.slots
        self.ring = Ring(self.placement)
        self.slots, self.slot_buffers, self.regions = [], [], {}
        self.staging = [None] * self.placement.slots

    def unpin(self) -> None:
        """Move the master weights into ordinary (pageable) memory and give the pinned arena back, one chunk
        at a time, so no more than one chunk is ever held twice. Call after `release`. (The machine's shared host
        copy stays as it is: its pages go with the last process that maps them.)"""
        if self.arena is None:
            return
        flat = [(lin, i, k) for i in self.swapped for k, lin in enumerate(self.linears[i])]
        last_user = {c: n for n, c in enumerate(self.arena.chunk_of)}  # the last tensor placed in each chunk
        for n, (lin, i, k) in enumerate(flat):
            plain = self.master[i][k].clone()  # a clone is pageable memory
            self.master[i][k] = lin.weight.data = plain
            self.arena.views[n] = None  # the last references into the chunk go with these two
            chunk = self.arena.chunk_of[n]
            if last_user[chunk] == n:
                self.arena.chunks[chunk] = None
        # the freed chunks sit in torch's pinned host cache until emptied (`host_memory.empty_pinned_host_cache`)
        give_back_freed_memory(pinned=True)
