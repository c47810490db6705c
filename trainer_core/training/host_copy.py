"""Who makes the machine's shared host copy of the frozen weights, and when the others attach
(`streaming.shared_host` holds the bytes).

The run opens in two waves (runs.headless.open_once): process 0 first, then the others, after a barrier. So the
first process of each machine (LOCAL_RANK 0) copies its frozen host weights into a new segment and posts the
segment's handle in the process group's key-value store, under its machine's key; every other process of the
machine reads the handle there (waiting for it if its machine's first process is still loading) and maps the
segment read-only. No collective call is needed while the processes open at different times. Once every process
has opened (after `Replicas.check_same_start`), `seal` drops the segment's name: the pages stay mapped, and go with
the last process of the machine, however it ends.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch import nn

from ..core.errors import UserInputError
from ..streaming.shared_host import SharedHostCopy, host_layout
from .distributed import Replicas

STORE_KEY = "trainer-core/host-copy/node-{node}"


def share_host_copy(transformer: nn.Module, streamed: tuple[int, ...], replicas: Replicas,
                    device: torch.device) -> SharedHostCopy | None:
    """Point the frozen host weights of `transformer` (the blocks in `streamed` and every frozen parameter on the
    CPU) at the machine's shared copy, made by the machine's first process; None with one process per machine, with
    TRAINER_CORE_HOST_COPY=private, or when nothing frozen is in host memory."""
    if replicas.local_size == 1 or not replicas.share_host:  # nobody on this machine to share with
        return None
    layout = host_layout(transformer, streamed)
    if not layout.nbytes:
        return None
    store = dist.distributed_c10d._get_default_store()  # the rendezvous' store, which every process reaches
    key = STORE_KEY.format(node=replicas.node)
    if replicas.local_rank == 0:
        copy = SharedHostCopy.create(layout)
        copy.fill(transformer)
        store.set(key, json.dumps([list(copy.handle), layout.nbytes]))  # plain values: no unpickling
    else:
        handle, nbytes = json.loads(store.get(key))
        handle = tuple(handle)
        if nbytes != layout.nbytes:
            raise UserInputError(
                f"process {replicas.rank} holds {layout.nbytes} bytes of frozen host weights, the first process of its "
                f"machine {nbytes}: they loaded different models. Every process must load the same model files.")
        copy = SharedHostCopy.attach(layout, handle)
        copy.adopt(transformer)
    copy.pin(device)
    return copy
