"""Data-parallel training over processes (torchrun): every process holds the model, the LoRA's gradients are summed.

    torchrun --nproc-per-node N -m trainer_core train --config run.toml

Each process (one per GPU) loads the whole frozen model (float8 blocks, swapped to CPU RAM as its own GPU
needs) and the same LoRA. One optimizer step takes `grad_accum_steps` micro-batches on each process, so
N x grad_accum_steps from the one data order. Every process draws every one of those micro-batches (samples,
noise, noise levels, caption dropout, all from the trainer's own generator) and computes only its share
(`Replicas.owns`: micro-batch k of a step belongs to process k mod N). So N processes train the samples one
process trains with N x the accumulation, and every process keeps the same data order and generator state:
the checkpoint process 0 writes continues all of them.

After its share's backward passes each process calls `Replicas.reduce_step`: first one small all-reduce of
(sum of the losses, any NaN/inf), so that all processes skip a non-finite step together, then the gradients,
summed in buckets of at most BUCKET_BYTES, in the LoRA's dtype, in parameter order. The sum is taken after
backward rather than with torch's DistributedDataParallel (which reduces buckets during backward) because
a process whose micro-batch has a NaN loss skips its backward (DDP's reducer would wait for it forever) and
each process draws the other processes' micro-batches between its own. It gives up DDP's overlap of
communication with backward, for gradients that are small: rank 16 on the real model's attention+mlp
Linears is about 0.4 GB in float32, tens of milliseconds on NVLink or PCIe against a step of seconds.

Gradients summed over processes are the same on every process, so the optimizer steps and the LoRA stay the
same everywhere (runs/agreement.py checks that every process starts from the same settings, state and data).
Process 0 alone writes: checkpoints, LoRA files, previews (the others read its checkpoints, so the run folder
must be one folder all of them see).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..core.errors import TrainingStopped, UserInputError

# Gradients are summed in buckets of at most this many bytes (DDP's default bucket size): each bucket is one
# all-reduce, and all buckets are in flight at once.
BUCKET_BYTES = 25 * (1 << 20)
# Training's collectives (a step's all-reduces) wait this long for a process; previews and checkpoints that
# process 0 makes between steps fit well within it.
STEP_TIMEOUT = timedelta(minutes=30)
# The other processes wait this long for process 0 to cache the dataset (a first run over thousands of images).
CACHE_TIMEOUT = timedelta(hours=12)


@dataclass(frozen=True)
class Replicas:
    """This process's place among the data-parallel processes of one run (one process: rank 0 of 1)."""

    rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    group: Any = None  # the process group of the step's all-reduces (NCCL on GPUs, gloo on CPUs)
    cpu_group: Any = None  # gloo, with CACHE_TIMEOUT: waiting for process 0 and small checks
    local_rank: int = 0  # this process's place on its machine (torchrun's LOCAL_RANK)
    node: int = 0  # the machine's place among the run's machines (torchrun's GROUP_RANK)
    local_size: int = 1  # the run's processes on this machine (torchrun's LOCAL_WORLD_SIZE)
    # One host copy of the frozen weights per machine (training.host_copy); False: one per process (comparisons).
    share_host: bool = True

    @property
    def writes(self) -> bool:
        """Only process 0 writes checkpoints, LoRA files, previews and the run folder's lock."""
        return self.rank == 0

    def owns(self, k: int) -> bool:
        """Whether micro-batch `k` of a step (0 .. size x grad_accum_steps - 1) is this process's to compute."""
        return k % self.size == self.rank

    def reduce_step(self, params: list[torch.nn.Parameter], loss_sum: float, finite: bool) -> tuple[float, bool]:
        """Sum the step's losses and gradients over the processes: (loss sum of all, finite everywhere). When a
        process met a NaN/inf loss every process returns (nan, False) and keeps its gradients (the trainer
        skips the step). One process: the values as they are."""
        if self.size == 1:
            return loss_sum, finite
        device = params[0].device if params else self.device
        status = torch.tensor([loss_sum if finite else 0.0, 0.0 if finite else 1.0], dtype=torch.float64,
                              device=device)
        dist.all_reduce(status, group=self.group)
        loss_total, nonfinite = status.tolist()
        if nonfinite > 0:
            return math.nan, False
        all_reduce_gradients(params, self.group)
        return loss_total, True

    def any(self, flag: bool) -> bool:
        """True on every process when `flag` is true on one of them (a stop request reaches all at one step)."""
        if self.size == 1:
            return flag
        value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group)
        return bool(value.item())

    def wait_for_writer(self) -> None:
        """Every process waits here until all (process 0 with its work done) arrive."""
        if self.size > 1:
            dist.barrier(group=self.cpu_group)

    def gather(self, value: Any) -> list[Any]:
        """`value` (a small picklable object) of every process, in process order; one process: [value]. Over the
        gloo group, so it works before and after the GPUs' group is busy (runs/agreement.py compares with it)."""
        if self.size == 1:
            return [value]
        values: list[Any] = [None] * self.size
        dist.all_gather_object(values, value, group=self.cpu_group)
        return values

    def leave(self) -> None:
        if self.size > 1 and dist.is_initialized():
            dist.destroy_process_group()


ONE_PROCESS = Replicas()


def all_reduce_gradients(params: list[torch.nn.Parameter], group: Any, bucket_bytes: int = BUCKET_BYTES) -> None:
    """Sum every parameter's gradient over the processes of `group`, in place: consecutive parameters of one
    dtype flattened into buckets of at most `bucket_bytes`, all buckets in flight at once. A parameter without
    a gradient on this process counts as zeros."""
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    pending = []
    for bucket in _buckets(grads, bucket_bytes):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        pending.append((dist.all_reduce(flat, group=group, async_op=True), bucket, flat))
    for work, bucket, flat in pending:
        work.wait()
        for g, part in zip(bucket, flat.split([g.numel() for g in bucket])):
            g.copy_(part.view_as(g))


def _buckets(tensors: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if not buckets or t.dtype != buckets[-1][0].dtype or size + nbytes > limit:
            buckets.append([])
            size = 0
        buckets[-1].append(t)
        size += nbytes
    return buckets


def process_group_options(platform: str, cuda: bool, nccl: bool) -> tuple[str, dict[str, Any]]:
    """(backend, keyword arguments of init_process_group) for the step's process group on `platform`
    (sys.platform), with or without CUDA GPUs and torch's NCCL (`dist.is_nccl_available()`).

    NCCL where there are GPUs and torch has it (Linux builds); gloo everywhere else, also on Windows GPUs (torch
    has no NCCL there). On Windows the rendezvous store must not ask for libuv (torch's Windows wheels are built
    without it, and torchrun users otherwise meet "use_libuv was requested but PyTorch was built without libuv
    support"): `use_libuv=0` in the env:// address."""
    backend = "nccl" if cuda and nccl and platform != "win32" else "gloo"
    options: dict[str, Any] = {}
    if platform == "win32":
        options["init_method"] = "env://?use_libuv=0"
    return backend, options


def join(env: dict[str, str] | None = None) -> Replicas:
    """This process's Replicas, from the variables torchrun sets (WORLD_SIZE, RANK, LOCAL_RANK, GROUP_RANK,
    MASTER_ADDR, MASTER_PORT); without them (or with one process) a single process on the GPU, or the CPU.
    Several processes use NCCL on GPUs (process i on GPU LOCAL_RANK) and gloo on CPUs (process_group_options).
    TRAINER_CORE_HOST_COPY=private gives every process its own host copy of the frozen weights (for comparisons
    such as benchmarks/host_memory.py; the default shares one per machine)."""
    env = os.environ if env is None else env
    size = int(env.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if size <= 1:
        return Replicas(device=torch.device("cuda") if cuda else torch.device("cpu"))
    rank = int(env["RANK"])
    local = int(env.get("LOCAL_RANK", rank))
    node = int(env.get("GROUP_RANK", "0"))
    share = env.get("TRAINER_CORE_HOST_COPY", "shared").strip().lower()
    if share not in ("shared", "private"):
        raise UserInputError(f"TRAINER_CORE_HOST_COPY={share!r}: choose 'shared' (the default) or 'private'.")
    if cuda:
        if local >= torch.cuda.device_count():
            raise UserInputError(
                f"process {rank} is local process {local}, but this machine has {torch.cuda.device_count()} GPUs: "
                "start at most one process per GPU (torchrun --nproc-per-node N)."
            )
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend, options = process_group_options(sys.platform, cuda, dist.is_nccl_available())
    dist.init_process_group(backend, rank=rank, world_size=size, timeout=STEP_TIMEOUT,
                            **options, **({"device_id": device} if backend == "nccl" else {}))
    cpu_group = dist.new_group(backend="gloo", timeout=CACHE_TIMEOUT)
    return Replicas(rank=rank, size=size, device=device, group=dist.group.WORLD, cpu_group=cpu_group,
                    local_rank=local, node=node, local_size=int(env.get("LOCAL_WORLD_SIZE", size)),
                    share_host=share == "shared")


def world_size_note(meta: dict, processes: int, grad_accum_steps: int) -> str | None:
    """A sentence when a checkpoint was written by another number of processes than resume it now (None when the
    same). The run goes on where it stopped in its data order; a step takes processes x grad_accum_steps
    micro-batches, so the same count keeps the samples of every step (equal within float rounding, not bit for
    bit: the gradients are summed in another order)."""
    before = int(meta.get("processes", 1))
    if before == processes:
        return None
    accum_before = int(meta["train"]["grad_accum_steps"])
    per_step_before, per_step = before * accum_before, processes * grad_accum_steps
    head = (f"the checkpoint of step {meta['step']} was written by {before} process{'es' if before > 1 else ''} "
            f"x grad_accum_steps {accum_before}, and {processes} x {grad_accum_steps} resume it:")
    if per_step == per_step_before:
        return f"{head} each step still takes {per_step} micro-batches, the same samples as before."
    hint = (f" (grad_accum_steps = {per_step_before // processes} keeps them)" if per_step_before % processes == 0
            else "")
    return (f"{head} a step now takes {per_step} micro-batches instead of {per_step_before}{hint}; the data order "
            "goes on where it stopped.")


def lost_peer(error: BaseException, replicas: Replicas) -> bool:
    """Whether `error` is a collective's failure because another process of the run is gone (killed, or failed
    on its own): gloo says so in a RuntimeError naming itself, NCCL in a `DistError`."""
    if replicas.size == 1 or isinstance(error, (UserInputError, TrainingStopped)) or not isinstance(error, RuntimeError):
        return False
    text = str(error).lower()
    return isinstance(error, dist.DistError) or "gloo" in text or "nccl" in text


def lost_peer_message(replicas: Replicas, trainer) -> str:
    """For a person, when another process is gone: what happened, where the run's newest checkpoint is, how to go
    on. Process 0 writes checkpoints (also of its last finished step as it stops, Trainer.train), so it names it."""
    head = (f"process {replicas.rank} of {replicas.size}: another process of this run stopped during step "
            f"{trainer.step + 1} (killed, or failed: its own message above or torchrun's summary says which), so "
            "this one stops too.")
    if not replicas.writes:
        return f"{head} Process 0 writes the checkpoints (its message names the newest). Run the same command to resume."
    if trainer.saved_step is None:
        return f"{head} No checkpoint was written yet: run the same command to start again."
    return (f"{head} The newest checkpoint, step {trainer.saved_step} in {trainer.run_dir / 'checkpoints'}, is "
            "complete: run the same command to resume from it.")
