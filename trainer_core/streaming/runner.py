"""Running the transformer's blocks: activation checkpointing and block streaming.

`BlockRunner` replaces each block's `forward` (an instance attribute, so module names, state dict keys
and the diffusers forward and pipeline stay untouched) with one that
  1. has the swapper issue the copies the ring policy asks for (`swap_placement.Ring`) and wait for the
     block's own weights,
  2. runs the block, under activation checkpointing when training with it on,
  3. in training, wraps the outputs in `_BackwardMark`, whose backward runs right before the block's
     own backward (and its checkpoint recompute): there the swapper does the same for the backward pass,
     which walks the blocks in reverse.
While training with checkpointing it keeps each block's modulation outputs (one row per sample) from the
forward and hands them to the recompute, so the modulation Linears run once per step and a streamed block's
backward copy leaves them out. Given the timesteps of the next training forwards (`plan_modulation`), the
first of them computes the streamed blocks' modulation outputs for all of them (`models.modulation`), and the
others copy those blocks without their modulation weights, a third of their bytes (modulation ahead,
`swap_placement`). In the last block the text stream's output is thrown away by the model, so
it leaves the graph there (detached) and its backward never runs on zero gradients.

`BlockSwapper` keeps the frozen base Linear weights of the streamed blocks (`swap_placement.Placement`:
which blocks, how deep the ring) in a CPU master copy, one contiguous blob per block (pinned on CUDA, packed
into a `PinnedArena`), and only ever copies host-to-device, one contiguous range per copy, into a ring of
GPU slots, on a side stream ordered by events. LoRA parameters, biases, norms and scales stay on the GPU.
An evicted block's weights point at an empty placeholder, so a block run without its weights fails loudly
instead of computing with another block's. On a CPU device the copies are plain synchronous copies into
the slots, which keeps the bookkeeping (and its tests) identical.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.utils.checkpoint
from torch import nn

from ..models.float8 import FLOAT8, frozen_linears
from ..models.float8 import activations as float8_activations
from ..models.float8 import compiled as float8_compiled
from ..models.modulation import modulation_inputs, supports_modulation_ahead
from ..models.qwen_arch import MODULATION_LINEARS
from .placement import (
    BACKWARD, BACKWARD_PART, FORWARD, MIN_RING, BlobLayout, Load, Placement, Ring, blob_layout, default_placement,
)

NUM_SLOTS = MIN_RING  # the default ring depth (the planner's and the swapper's)
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


BLOB_CHUNK_MAX = 8 << 30  # the largest pinned chunk the arena asks for


def blob_chunks(blob_bytes: int, count: int, largest: int = BLOB_CHUNK_MAX) -> list[int]:
    """Power-of-two chunk sizes that hold `count` whole blobs in the fewest bytes (largest chunks first).

    A real block's float8 blob is 324 MiB: 1 GiB chunks hold 3 (5% unused), 8 GiB chunks 25 (1%); a small
    dynamic programme over the chunk sizes finds the cheapest mix, e.g. 29 blobs: 8 GiB + 1 GiB + 512 MiB,
    0.32 GiB unused."""
    sizes = []
    cap = _pow2ceil(blob_bytes)
    while cap <= max(largest, _pow2ceil(blob_bytes)):
        sizes.append(cap)
        cap *= 2
    best: list[tuple[int, list[int]]] = [(0, [])]  # best[m]: (bytes, chunks) for m blobs
    for m in range(1, count + 1):
        options = []
        for cap in sizes:
            held = min(m, cap // blob_bytes)
            total, chunks = best[m - held]
            options.append((total + cap, [cap, *chunks]))
        best.append(min(options))
    return sorted(best[count][1], reverse=True)


def blob_arena_layout(blob: BlobLayout, sizes: list[int], blocks: int) -> tuple[list[int], list[tuple[int, int]]]:
    """The arena for `blocks` blobs of `blob`'s layout, each whole in one chunk (so a block moves in one copy):
    (chunk capacities, (chunk, offset) of every tensor, block by block, in `sizes`' order)."""
    caps = blob_chunks(blob.whole_bytes, blocks) if blocks else []
    places = []
    chunk, used = 0, 0
    for _ in range(blocks):
        if used + blob.whole_bytes > caps[chunk]:
            chunk, used = chunk + 1, 0
        places += [(chunk, used + blob.offsets[t]) for t in range(len(sizes))]
        used += blob.whole_bytes
    return caps, places


class PinnedArena:
    """Host copies of tensors packed into a few (pinned) byte buffers laid out by `arena_layout` (or by a
    given `layout`: (chunk capacities, (chunk, offset) per tensor)).

    Filled one tensor at a time (`store`), each chunk allocated when its first tensor arrives, so moving
    weights in (and freeing each original as soon as it is copied) never holds more than one chunk twice.
    Pinning may fail (the OS or the driver caps page-locked memory, e.g. on Windows): the chunks from
    then on are ordinary memory, `pin_error` says why, and `pinned[c]` tells each chunk's kind.
    """

    def __init__(self, specs: list[tuple[torch.Size, torch.dtype]], pin: bool,
                 layout: tuple[list[int], list[tuple[int, int]]] | None = None):
        self.specs = list(specs)
        self.sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in self.specs]
        self.caps, self.places = layout or arena_layout(self.sizes)
        self.chunks: list[torch.Tensor | None] = [None] * len(self.caps)
        self.pinned = [False] * len(self.caps)
        self.pin = pin
        self.pin_error: str | None = None
        self.chunk_of = [c for c, _ in self.places]  # arena chunk index of each tensor, in order
        self.views: list[torch.Tensor | None] = [None] * len(self.specs)

    def chunk(self, c: int) -> torch.Tensor:
        """Chunk c, allocated (pinned while the system allows) on first use."""
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
        view = self.chunk(c)[offset:offset + self.sizes[n]].view(dtype).view(shape)
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
    def __init__(self, transformer: nn.Module, placement: Placement, device: torch.device,
                 trace: list | None = None):
        self.device = device
        self.placement = placement
        self.swapped = list(placement.streamed)
        self.cuda = device.type == "cuda"
        self.trace = trace  # when a list: ("copy", block, bytes) and ("wait", block) appended in issue order
        blocks = transformer.transformer_blocks
        # Per swapped block: the frozen Linears, in a fixed order, and their CPU master weights, each block one
        # blob (backward part first, modulation Linears last) in one arena, pinned on CUDA so host-to-device
        # copies are truly asynchronous.
        named = {i: frozen_linears(blocks[i]) for i in self.swapped}
        self.linears = {i: [m for _, m in named[i]] for i in self.swapped}
        flat = [lin for i in self.swapped for lin in self.linears[i]]
        first = self.swapped[0]
        sizes = [lin.weight.numel() * lin.weight.element_size() for lin in self.linears[first]]
        self.forward_only = [_is_modulation(name) for name, _ in named[first]]
        self.blob = blob_layout(sizes, self.forward_only)
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

    @property
    def slot_bytes(self) -> int:
        return sum(buf.numel() for buf in self.slot_buffers)

    @property
    def pinned_status(self) -> str:
        """One sentence for the status: where the streamed blocks' weights live."""
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
            self.trace.append(("copy", load.block, end - start))

    def before(self, pass_: str, i: int) -> None:
        """Right before block i runs in `pass_` (swap_placement.FORWARD or BACKWARD): issue the copies the ring
        policy asks for and make the compute stream wait for block i's weights."""
        ensure, ahead = self.ring.loads_at(pass_, i)
        if ensure is not None:
            self._issue(ensure)
        if i in self.master:
            slot = self.placement.slot(i)
            if self.cuda and self.copy_done[slot] is not None:
                torch.cuda.current_stream(self.device).wait_event(self.copy_done[slot])
            if self.trace is not None:
                self.trace.append(("wait", i))
        for load in ahead:
            self._issue(load)

    def release(self) -> None:
        """Point every swapped block back at its master weights (for saving or moving the model)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.copy_stream)
        for i in self.swapped:
            for lin, w in zip(self.linears[i], self.master[i]):
                lin.weight.data = w
        self.slot_owner = [None] * self.placement.slots
        self.ring = Ring(self.placement)
        self.slots, self.slot_buffers, self.regions = [], [], {}
        self.staging = [None] * self.placement.slots

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


class BlockRunner:
    """Installs checkpointing, swapping and the modulation cache on every block of `transformer` (see the
    module docstring). `placement` says which blocks are streamed and how deep the ring is; by default
    `blocks_to_swap` blocks spread over the depth (`swap_placement.default_placement`)."""

    def __init__(self, transformer: nn.Module, device: torch.device, blocks_to_swap: int = 0,
                 checkpointing: bool = False, placement: Placement | None = None, compile_float8: bool = False,
                 fp8_activations: bool = False, compile_on_cpu: bool = False):
        """`compile_float8`: the frozen block Linears compiled so float8 weights are multiplied without a bf16
        copy (`models.float8_compiled`; CUDA + Triton, ignored where unavailable, `compiled_float8` says whether
        it is on). `compile_on_cpu`: on the CPU too (tests, benchmarks; off by default, see float8_compiled).
        `fp8_activations`: the float8 block Linears multiply in float8 with `torch._scaled_mm`
        (`models.float8_activations`; where the device runs it, else the eager path); `fp8_status` says which.
        The two are alternatives: asking for both is refused."""
        if compile_float8 and fp8_activations:
            raise ValueError("compile_float8 and fp8_activations are alternatives; choose one")
        uninstall_leftover_runner(transformer)  # one runner per model: one dropped without uninstall() goes first
        self.transformer = transformer
        self.device = device
        self.checkpointing = checkpointing
        blocks = transformer.transformer_blocks
        n = len(blocks)
        if placement is None and blocks_to_swap:
            placement = default_placement(n, blocks_to_swap)
        self.placement = placement if placement is not None and placement.streamed else None
        swapped = list(self.placement.streamed) if self.placement else []
        self._place(swapped)
        self.trace: list | None = None
        self.swapper = BlockSwapper(transformer, self.placement, device) if swapped else None
        self._phase = FORWARD
        self._caching = False  # keep modulation outputs (a training forward under checkpointing)
        self._modulation_cache: dict[tuple[int, str], torch.Tensor] = {}
        # Modulation ahead (plan_modulation): the timesteps of the planned training forwards not begun yet; per
        # later forward of the window its modulation inputs and the streamed blocks' outputs; the forward now.
        self._streamed = set(swapped)
        self._planned: list[torch.Tensor] = []
        self._ahead: list[_ModulationAhead] = []
        self._now: _ModulationAhead | None = None  # this forward reads its modulation outputs from here
        self._filling: list[torch.Tensor] | None = None  # this forward computes the window's (its timesteps)
        self._fill_inputs: dict[str, torch.Tensor] | None = None  # this forward's own modulation inputs
        self.forwards_from_plan = 0  # training forwards that took their streamed modulation outputs from a plan
        self._compiled: dict | None = None
        if compile_float8 and float8_compiled.available(device, allow_cpu=compile_on_cpu):
            self._compiled = float8_compiled.install([lin for block in blocks for _, lin in frozen_linears(block)])
        self._fp8: dict | None = None
        self.fp8_status: str | None = None
        if fp8_activations:
            self._install_fp8_activations()
        for i, block in enumerate(blocks):
            block.forward = _wrap(block.forward, functools.partial(self._run_block, i), self)
            for name, lin in frozen_linears(block):
                if _is_modulation(name):
                    key = (i, name.removesuffix(".base_layer"))  # peft's wrapper adds .base_layer
                    lin.forward = _wrap(lin.forward, functools.partial(self._modulation, key), self)

    def _install_fp8_activations(self) -> None:
        linears = [lin for block in self.transformer.transformer_blocks for _, lin in frozen_linears(block)]
        stored_float8 = any(lin.weight.dtype == FLOAT8 for lin in linears)
        scaling = float8_activations.scaling_for(self.device) if stored_float8 else None
        if scaling is not None:
            self._fp8 = float8_activations.install(linears, scaling)
        self.fp8_status = float8_activations.status(len(self._fp8 or {}), len(linears), scaling, stored_float8)

    @property
    def compiled_float8(self) -> bool:
        """Whether the frozen block Linears run through the compiled expression (`float8_compiled`)."""
        return self._compiled is not None

    def record(self) -> list:
        """Start recording, in issue order, ("copy", block, bytes), ("wait", block) and ("compute", block, pass):
        the events `planner.timeline` predicts. Returns the list that fills."""
        self.trace = []
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
        self._phase = pass_
        if self.swapper is not None:
            self.swapper.before(pass_, i)
        if self.trace is not None:
            self.trace.append(("compute", i, pass_))

    def plan_modulation(self, timesteps: list[torch.Tensor]) -> bool:
        """The timesteps (B,), as the transformer receives them, of the next training forwards, in order: the
        first computes the streamed blocks' modulation outputs for all of them, the others copy those blocks
        without their modulation weights. False (and nothing planned) where it does not apply: no block
        streamed, no checkpointing, or modulation inputs that are not a function of the timestep alone."""
        self.forget_modulation()
        if self.swapper is None or not self.checkpointing or not supports_modulation_ahead(self.transformer):
            return False
        self._planned = list(timesteps)
        return True

    def forget_modulation(self) -> None:
        """Drop what was planned or computed ahead (the trainer's draws changed: a resume, an interruption)."""
        self._planned, self._ahead, self._now, self._filling, self._fill_inputs = [], [], None, None, None
        if self.swapper is not None:
            self.swapper.ring.forward_needs_modulation = self.swapper.ring.next_forward_needs_modulation = True

    @property
    def planned_forwards(self) -> int:
        """Training forwards planned or computed ahead and not begun yet."""
        return len(self._planned) + len(self._ahead)

    def _begin_forward(self, training: bool) -> None:
        """Before block 0: is this forward a window's first (it computes the modulation outputs ahead), a later
        one (it reads them), or neither (a preview's, a validation's, an unplanned one)? The ring learns what
        this forward and the next one need."""
        self._now = self._filling = self._fill_inputs = None
        if training and self.checkpointing:
            if self._ahead:
                self._now = self._ahead.pop(0)
                self.forwards_from_plan += 1
            elif self._planned:
                self._filling, self._planned = self._planned, []
                self._ahead = [_ModulationAhead(t) for t in self._filling[1:]]
        if self.swapper is not None:
            self.swapper.ring.forward_needs_modulation = self._now is None
            self.swapper.ring.next_forward_needs_modulation = not self._ahead

    def _run_block(self, i: int, forward, *args, **kwargs):
        training = torch.is_grad_enabled()
        if i == 0:
            self._begin_forward(training)
        self._start(FORWARD, i)
        if self.checkpointing and training:
            self._caching = True
            try:
                outputs = torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
            finally:
                self._caching = False
        else:
            outputs = forward(*args, **kwargs)
        if not training:
            return outputs
        if i == len(self.transformer.transformer_blocks) - 1:
            # The model uses only the image stream of the last block (outputs are (text, image)): the text
            # output leaves the graph, so no backward runs through its dead half on zero gradients.
            outputs = (outputs[0].detach(), *outputs[1:])
        live = [k for k, o in enumerate(outputs) if o.requires_grad]
        if not live:
            return outputs
        marked = iter(_BackwardMark.apply(functools.partial(self._start, BACKWARD, i), *(outputs[k] for k in live)))
        return tuple(next(marked) if k in live else o for k, o in enumerate(outputs))

    def _modulation(self, key: tuple[int, str], forward, x: torch.Tensor) -> torch.Tensor:
        """A frozen modulation Linear: (B, D) -> (B, 6 D). Its output depends on the timestep only and needs
        no gradient, so the checkpoint recompute takes the forward's (same values, bit for bit) and the
        weights need not be on the GPU in backward."""
        if self._phase == BACKWARD and key in self._modulation_cache:
            return self._modulation_cache.pop(key)
        ahead = key[0] in self._streamed and self._phase == FORWARD
        if ahead and self._now is not None:  # computed by the window's first forward; the weights are not here
            y = self._now.take(key, x)
        else:
            y = forward(x)
            if ahead and self._filling is not None:
                self._fill_ahead(key, forward, x)
        if self._caching:
            self._modulation_cache[key] = y
        return y

    def _fill_ahead(self, key: tuple[int, str], forward, x: torch.Tensor) -> None:
        """The window's first forward, at a streamed block's modulation Linear: its outputs for every later
        forward of the window, each computed alone (the shapes, hence the kernels and values, of that forward)."""
        if x.requires_grad:
            raise RuntimeError(f"modulation ahead: the input of block {key[0]}'s {key[1]} needs a gradient")
        if self._fill_inputs is None:  # first use in this forward: the inputs, once
            self._fill_inputs = modulation_inputs(self.transformer, self._filling[0], x.dtype)
            for entry in self._ahead:
                entry.inputs = modulation_inputs(self.transformer, entry.timestep, x.dtype)
        if x.device.type == "cpu":  # free here (no device sync): the plan matches this forward's timesteps
            _ModulationAhead.check(key, x, self._fill_inputs)
        with torch.no_grad():
            for entry in self._ahead:
                entry.outputs[key] = forward(entry.inputs[key[1]])

    def uninstall(self, unpin: bool = False) -> None:
        """Restore the blocks' own forward and full weights. The model stays where it is: resident blocks
        on the device, swapped blocks' Linear weights on their CPU master copies (a later BlockRunner
        places everything again). `unpin`: those masters move to pageable memory, the pinned arena is freed."""
        if self.swapper is not None:
            self.swapper.release()
            if unpin:
                self.swapper.unpin()
            self.swapper = None
        self._modulation_cache.clear()
        self.forget_modulation()
        if self._compiled is not None:
            float8_compiled.uninstall(self._compiled)
            self._compiled = None
        if self._fp8 is not None:
            float8_activations.uninstall(self._fp8)
            self._fp8 = None
        for block in self.transformer.transformer_blocks:
            _unwrap(block, "forward")
            for _, lin in frozen_linears(block):
                _unwrap(lin, "forward")


class _ModulationAhead:
    """One planned training forward: its timestep (B,), its modulation inputs {Linear name: (rows, D)} and
    the streamed blocks' modulation outputs {(block, Linear name): (rows, 6 D)}, taken as the forward runs."""

    def __init__(self, timestep: torch.Tensor):
        self.timestep = timestep
        self.inputs: dict[str, torch.Tensor] = {}
        self.outputs: dict[tuple[int, str], torch.Tensor] = {}

    def take(self, key: tuple[int, str], x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":
            self.check(key, x, self.inputs)
        return self.outputs.pop(key)

    @staticmethod
    def check(key: tuple[int, str], x: torch.Tensor, planned: dict[str, torch.Tensor]) -> None:
        if not torch.equal(x, planned[key[1]]):
            raise RuntimeError(f"modulation ahead: block {key[0]}'s {key[1]} got another input than planned (the "
                               "planned timesteps are not this forward's)")


def swapped_blocks(num_blocks: int, blocks_to_swap: int) -> list[int]:
    """The blocks whose frozen weights are streamed by default for `blocks_to_swap` (spread over the depth,
    `swap_placement.default_placement`). The loader reads those weights straight into host memory."""
    return list(default_placement(num_blocks, blocks_to_swap).streamed) if blocks_to_swap else []


def _is_modulation(name: str) -> bool:
    """A frozen Linear's name inside a block (peft's wrapper adds `.base_layer`) is a modulation Linear."""
    return name.removesuffix(".base_layer") in MODULATION_LINEARS


def _wrap(forward, ours: functools.partial, runner: BlockRunner) -> functools.partial:
    """`ours` called with the module's own forward first (unwrapping one a previous runner left). The wrapper
    names its `runner` outright: partial() flattens a partial of a partial, so the runner cannot be dug out of
    the wrapper's layers (issue 25: that digging broke the next trainer after one dropped without close())."""
    original = forward.__wrapped_forward__ if _is_ours(forward) else forward
    wrapped = functools.partial(ours, original)
    wrapped.__wrapped_forward__ = original
    wrapped.__block_runner__ = runner
    return wrapped


def _unwrap(module: nn.Module, attr: str) -> None:
    forward = module.__dict__.get(attr)
    if _is_ours(forward):
        original = forward.__wrapped_forward__
        if getattr(original, "__self__", None) is module and getattr(original, "__func__", None) is getattr(
                type(module), attr, None):
            del module.__dict__[attr]  # it was the class's own method
        else:
            setattr(module, attr, original)


def uninstall_leftover_runner(transformer: nn.Module) -> None:
    """Uninstall every BlockRunner still installed on `transformer`: one whose trainer was dropped without
    closing it (its wrappers keep it alive). Found through any block's wrappers, so a runner whose block 0 was
    restored by other means is still found."""
    runners = []
    for block in transformer.transformer_blocks:
        for module in (block, *(lin for _, lin in frozen_linears(block))):
            forward = module.__dict__.get("forward")
            if _is_ours(forward) and not any(r is forward.__block_runner__ for r in runners):
                runners.append(forward.__block_runner__)
    for runner in runners:
        runner.uninstall()


def _is_ours(forward) -> bool:
    return isinstance(forward, functools.partial) and hasattr(forward, "__block_runner__")

