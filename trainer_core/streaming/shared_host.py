"""One host copy per machine of the frozen weights that live in host memory, shared by the machine's processes.

With several processes on one machine (torchrun, one per GPU) every process would otherwise hold its own copy of the
same frozen bytes: the streamed blocks' masters on a GPU, the whole frozen model on a CPU device. Here the first
process of the machine copies them into one `shared_segment.SharedSegment`; the others map it read-only and point
their parameters at it, dropping their own copies (`training.host_copy` says who does what, and when).

Layout (`host_layout`, the same in every process: it comes from the model's own modules): first the streamed blocks,
each one contiguous blob in the swapper's blob layout (`placement.blob_layout`: backward part, then the modulation
Linears), so that the swapper copies a block from the shared bytes in one range (`SharedHostCopy.blob`); then every
other frozen parameter that is in host memory, in `named_parameters` order; then the float8 scales (`weight_scale`
buffers) of those Linears that have one in host memory (a scale made while quantising cannot be recomputed without
the weight it came from). Every tensor starts at a multiple of BLOB_ALIGN bytes.

On CUDA the mapping is registered as page-locked memory (cudaHostRegister; read-only where the driver supports it),
so the swapper's copies from it are asynchronous, as from its own pinned arena. Where the registration is refused
the swapper goes through its pinned staging buffers, as it does when pinning its arena is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..core.host_memory import give_back_freed_memory
from ..models.float8 import SCALE_BUFFER, frozen_linears
from ..models.modulation import is_modulation_linear
from .placement import BlobLayout, align_up, blob_layout
from .shared_segment import SharedSegment

CUDA_HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every CUDA context of the process
TRIM_EVERY = 256 << 20  # bytes copied into the segment between two trims of the C heap while filling it
CUDA_HOST_REGISTER_READ_ONLY = 8  # cudaHostRegisterReadOnly: the GPU only reads (needed for a read-only mapping)


@dataclass(frozen=True)
class HostEntry:
    name: str  # the parameter's name in the transformer
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int  # bytes from the start of the segment

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class HostLayout:
    entries: tuple[HostEntry, ...]
    blobs: dict[int, int]  # streamed block -> byte offset of its blob
    blob: BlobLayout | None  # the streamed blocks' blob layout (None: no block streamed)
    nbytes: int


def block_blob(block: nn.Module) -> tuple[list[tuple[str, nn.Linear]], BlobLayout]:
    """A streamed block's frozen Linears (in module order) and the blob layout of their weights: what the swapper
    copies as one range."""
    named = frozen_linears(block)
    sizes = [lin.weight.numel() * lin.weight.element_size() for _, lin in named]
    return named, blob_layout(sizes, [is_modulation_linear(name) for name, _ in named])


def host_layout(transformer: nn.Module, streamed: tuple[int, ...] | list[int]) -> HostLayout:
    """Where each frozen host tensor goes in the shared segment (module docstring): the streamed blocks' Linear
    weights wherever they are now (they move to host memory), then the other frozen parameters on the CPU."""
    entries, blobs, blob, end = [], {}, None, 0
    covered = set()
    for i in streamed:
        named, blob = block_blob(transformer.transformer_blocks[i])
        blobs[i] = end
        for (name, lin), offset in zip(named, blob.offsets):
            full = f"transformer_blocks.{i}.{name}.weight"
            entries.append(HostEntry(full, tuple(lin.weight.shape), lin.weight.dtype, end + offset))
            covered.add(full)
        end += blob.whole_bytes
    for name, p in transformer.named_parameters():
        if name in covered or p.requires_grad or p.device.type != "cpu":
            continue
        entries.append(HostEntry(name, tuple(p.shape), p.dtype, end))
        end = align_up(end + math.prod(p.shape) * p.dtype.itemsize)
    weights = {e.name for e in entries}
    for name, buffer in transformer.named_buffers():
        owner, _, leaf = name.rpartition(".")
        if leaf == SCALE_BUFFER and f"{owner}.weight" in weights and buffer.device.type == "cpu":
            entries.append(HostEntry(name, tuple(buffer.shape), buffer.dtype, end))
            end = align_up(end + math.prod(buffer.shape) * buffer.dtype.itemsize)
    return HostLayout(tuple(entries), blobs, blob, end)


def current(transformer: nn.Module, name: str) -> torch.Tensor:
    """The transformer's tensor `name` now: a parameter, or a scale buffer."""
    owner, _, leaf = name.rpartition(".")
    return getattr(transformer.get_submodule(owner), leaf)


def point_at(transformer: nn.Module, name: str, view: torch.Tensor) -> None:
    """Make tensor `name` of the transformer (a parameter or a scale buffer) `view`, dropping its own storage."""
    owner, _, leaf = name.rpartition(".")
    module = transformer.get_submodule(owner)
    if leaf in module._parameters:
        module._parameters[leaf].data = view
    else:
        module._buffers[leaf] = view


class SharedHostCopy:
    """The machine's host copy of `layout`'s tensors in `segment`; `fill` (the first process) or `adopt` (the
    others) points the transformer's parameters at it."""

    def __init__(self, layout: HostLayout, segment: SharedSegment):
        self.layout, self.segment = layout, segment
        self.pinned, self.pin_error = False, None

    @classmethod
    def create(cls, layout: HostLayout) -> SharedHostCopy:
        return cls(layout, SharedSegment.create(layout.nbytes))

    @classmethod
    def attach(cls, layout: HostLayout, handle: tuple) -> SharedHostCopy:
        return cls(layout, SharedSegment.attach(handle, layout.nbytes))

    @property
    def handle(self) -> tuple:
        return self.segment.handle

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes

    def view(self, entry: HostEntry) -> torch.Tensor:
        return self.segment.tensor[entry.offset:entry.offset + entry.nbytes].view(entry.dtype).view(entry.shape)

    def fill(self, transformer: nn.Module) -> None:
        """Copy every tensor in, one at a time, each parameter pointing at its copy at once (its own storage goes
        before the next is copied); then map the segment read-only like the other processes."""
        since_trim = 0
        for entry in self.layout.entries:
            view = self.view(entry)
            view.copy_(current(transformer, entry.name))
            point_at(transformer, entry.name, view)
            since_trim += entry.nbytes
            if since_trim >= TRIM_EVERY:  # the C heap keeps freed tensors until trimmed: give them back as we go
                give_back_freed_memory()
                since_trim = 0
        self.segment = self.segment.read_only()
        self.adopt(transformer)  # the read-only views; the writable mapping goes with its last view

    def adopt(self, transformer: nn.Module) -> None:
        """Point every tensor of the layout at the shared copy and drop this process's own copies (nothing to drop
        where the transformer was loaded from `given`: its tensors are the copy's already)."""
        for entry in self.layout.entries:
            p = current(transformer, entry.name)
            if tuple(p.shape) != entry.shape or p.dtype != entry.dtype:
                raise RuntimeError(f"{entry.name}: {tuple(p.shape)} {p.dtype} here, {entry.shape} {entry.dtype} in "
                                   "the shared host copy")
            if p.data_ptr() != self.view(entry).data_ptr():
                point_at(transformer, entry.name, self.view(entry))
        give_back_freed_memory()

    def given(self) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """The copy's tensors as a loader takes them instead of reading the file (`stream_into`'s `given`): each
        weight with its scale, each other parameter alone, all as stored."""
        views = {e.name: self.view(e) for e in self.layout.entries}
        suffix = f".{SCALE_BUFFER}"
        return {name: (view, views.get(name.removesuffix(".weight") + suffix))
                for name, view in views.items() if not name.endswith(suffix)}

    def blob(self, block: int) -> torch.Tensor:
        """Streamed block `block`'s blob: the bytes the swapper copies from."""
        start = self.layout.blobs[block]
        return self.segment.tensor[start:start + self.layout.blob.whole_bytes]

    def covers(self, blocks: list[int]) -> bool:
        return all(b in self.layout.blobs for b in blocks)

    def pin(self, device: torch.device) -> None:
        """On CUDA: register the mapping as page-locked (module docstring); `pinned`, `pin_error` say how it went."""
        if device.type != "cuda" or not self.nbytes:
            return
        flags = CUDA_HOST_REGISTER_PORTABLE | (0 if self.segment.writable else CUDA_HOST_REGISTER_READ_ONLY)
        code = torch.cuda.cudart().cudaHostRegister(self.segment.tensor.data_ptr(), self.nbytes, flags)
        code = int(getattr(code, "value", code))
        self.pinned = code == 0
        self.pin_error = None if self.pinned else f"cudaHostRegister returned error {code}"

    def seal(self) -> None:
        """Every process of the machine has attached: only the mappings keep the pages (shared_segment)."""
        self.segment.seal()

    @property
    def status(self) -> str:
        pinned = ("pinned" if self.pinned else
                  f"not pinned ({self.pin_error}; copies go through a pinned staging buffer)" if self.pin_error else
                  "host memory")
        return f"{self.nbytes / (1 << 30):.2f} GiB of frozen weights in one host copy for this machine's processes, {pinned}"
