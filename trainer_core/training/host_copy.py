"""Who makes the machine's shared host copy of the frozen weights, and when the others attach
(`streaming.shared_host` holds the bytes).

The run opens in two waves (runs.headless.open_once): process 0 first, then the others, after a barrier. The first
process of each machine (LOCAL_RANK 0) reads the transformer from its file, copies its frozen host weights into a new
segment and posts the segment's handle and layout in the process group's key-value store, under its machine's key
(always, also when nothing is in host memory: the others wait for that post). Every other process of the machine
waits there before it reads its transformer (`attach_before_load`), maps the segment read-only and loads with the
copy's tensors standing in for those parts of the file (`given`): it reads from the file only what is not in the
copy (on a GPU, the blocks resident on its GPU; on a CPU device nothing: the whole frozen model is the host copy),
so the machine's host RAM never holds a second copy, not even while loading. A model set that is already in memory
(the tiny model, a transformer a node loaded before) attaches after it is built (`share_host_copy`): its own copy
goes then. No collective call is needed while the processes open at different times. Once every process has opened
(after runs/agreement.check_same_start), `seal` drops the segment's name: the pages stay mapped, and go with the last
process of the machine, however it ends.

What is resident on a GPU is read from the file by each process, tensor by tensor straight to its GPU (after the
first process the operating system's page cache serves those reads from memory it can reclaim): copying it from the
shared copy instead would need the whole model in host memory at once, more than the streamed part this copy holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..core.errors import UserInputError
from ..streaming.shared_host import HostEntry, HostLayout, SharedHostCopy, host_layout
from ..streaming.shared_segment import SharedSegment
from .distributed import Replicas

STORE_KEY = "trainer-core/host-copy/node-{node}"


@dataclass
class Posted:
    """What the first process of the machine posted: the segment (mapped here read-only) and its tensors."""

    segment: SharedSegment | None  # None: nothing frozen is in host memory on that process
    entries: tuple[HostEntry, ...]
    nbytes: int

    @property
    def given(self) -> dict:
        """The copy's tensors as `ModelSet.ensure_transformer` takes them instead of reading them (empty: none)."""
        if self.segment is None:
            return {}
        return SharedHostCopy(HostLayout(self.entries, {}, None, self.nbytes), self.segment).given()


def _default_store():
    return dist.distributed_c10d._get_default_store()  # the rendezvous' store, which every process reaches


def _shares(replicas: Replicas) -> bool:
    return replicas.local_size > 1 and replicas.share_host


def post(store, node: int, copy: SharedHostCopy | None) -> None:
    """The first process of machine `node`: its copy's handle and layout, as plain values (nothing unpickled)."""
    entries = [] if copy is None else [[e.name, list(e.shape), str(e.dtype).removeprefix("torch."), e.offset]
                                       for e in copy.layout.entries]
    store.set(STORE_KEY.format(node=node), json.dumps({
        "handle": None if copy is None else list(copy.handle), "nbytes": 0 if copy is None else copy.nbytes,
        "entries": entries}))


def wait_for_post(store, node: int) -> Posted:
    """The machine's copy as its first process posted it (waiting for the post), mapped read-only."""
    data = json.loads(store.get(STORE_KEY.format(node=node)))
    entries = tuple(HostEntry(name, tuple(shape), getattr(torch, dtype), offset)
                    for name, shape, dtype, offset in data["entries"])
    segment = SharedSegment.attach(tuple(data["handle"]), data["nbytes"]) if data["handle"] else None
    return Posted(segment, entries, data["nbytes"])


def attach_before_load(replicas: Replicas, store=None) -> Posted | None:
    """A process of a machine that is not its first: wait for the machine's copy and map it, before reading the
    transformer (module docstring). None on the machine's first process and without sharing."""
    if not _shares(replicas) or replicas.local_rank == 0:
        return None
    return wait_for_post(store or _default_store(), replicas.node)


def share_host_copy(transformer: nn.Module, streamed: tuple[int, ...], replicas: Replicas, device: torch.device,
                    posted: Posted | None = None, store=None) -> SharedHostCopy | None:
    """Point the frozen host weights of `transformer` (the blocks in `streamed`, every frozen parameter on the CPU
    and their float8 scales) at the machine's shared copy, made by the machine's first process; None with one process
    per machine, with TRAINER_CORE_HOST_COPY=private, or when nothing frozen is in host memory. `posted`: what
    `attach_before_load` mapped (the transformer was loaded from it)."""
    if not _shares(replicas):  # nobody on this machine to share with
        return None
    store = store or _default_store()
    layout = host_layout(transformer, streamed)
    if replicas.local_rank == 0:
        copy = None
        if layout.nbytes:
            copy = SharedHostCopy.create(layout)
            copy.fill(transformer)
        post(store, replicas.node, copy)
    else:
        posted = posted or wait_for_post(store, replicas.node)
        if posted.entries != layout.entries:
            raise UserInputError(
                f"process {replicas.rank} holds {len(layout.entries)} frozen host tensors ({layout.nbytes} bytes), the "
                f"first process of its machine {len(posted.entries)} ({posted.nbytes} bytes), or in another layout: "
                "they loaded different models or placements. Every process must load the same model files and "
                "settings.")
        if posted.segment is None:
            return None
        copy = SharedHostCopy(layout, posted.segment)
        copy.adopt(transformer)
    if copy is not None:
        copy.pin(device)
    return copy
