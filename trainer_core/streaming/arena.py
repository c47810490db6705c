"""Host memory for the streamed blocks' frozen weights: a few pinned byte chunks, each holding whole blobs.

Why an arena: pinned host memory comes from torch's caching host allocator, which rounds every allocation up
to a power of two, so pinning each weight on its own would cost up to 2x (a 9 MiB weight takes 16 MiB). The
arena packs the weights into chunks whose sizes are powers of two already. The layouts are pure arithmetic
(the planner uses them to predict host RAM); `PinnedArena` holds the bytes.
"""

from __future__ import annotations

import math

import torch

from .placement import BlobLayout

MIB = 1 << 20
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


# A pinned chunk is page-locked whole when its first blob is copied in, while the weights it will receive still sit
# in ordinary memory (each is freed as it moves): the largest chunk is the fill's transient in host RAM. The first
# device check (H100, 27 float8 blocks of 324 MiB into 8 GiB chunks) measured it: 18.17 GiB of host RAM at init
# against 10.35 planned. So a chunk holds at most BLOBS_PER_CHUNK blobs: a few blobs per chunk already pack within
# about 5% (3 float8 Qwen-Image blobs in 1 GiB), and the transient stays one small chunk.
BLOBS_PER_CHUNK = 3


def largest_blob_chunk(blob_bytes: int) -> int:
    """The largest chunk the arena asks for: the smallest power of two holding BLOBS_PER_CHUNK blobs (or one)."""
    return _pow2ceil(BLOBS_PER_CHUNK * blob_bytes)


def blob_chunks(blob_bytes: int, count: int, largest: int | None = None) -> list[int]:
    """Power-of-two chunk sizes that hold `count` whole blobs in the fewest bytes (largest chunks first), none larger
    than `largest` (default `largest_blob_chunk`).

    A real block's float8 blob is 324 MiB: 1 GiB chunks hold 3 (5% unused), 512 MiB ones 1; a small dynamic programme
    over the chunk sizes finds the cheapest mix, e.g. 29 blobs: 9 x 1 GiB + 2 x 512 MiB,
    0.82 GiB unused (8 GiB chunks left 0.32 GiB, at a 7.8 GiB transient: above)."""
    largest = largest_blob_chunk(blob_bytes) if largest is None else largest
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
