"""Host memory: how much this machine has (`host_ram_bytes`), and giving freed memory back to the operating system.

Dropping a model frees its tensors, but on Linux glibc keeps freed blocks below its (adaptive, up to 32 MB)
mmap threshold in the heap for reuse: after the 15 GB text encoder is dropped, a good part of it would stay
in the process' resident memory, and the 19 GB transformer loaded next would come on top of it. glibc's
`malloc_trim(0)` returns every free page of the heap to the system. Elsewhere (macOS, Windows, musl) this is
a no-op: their allocators return large blocks on their own or offer no such call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
from functools import cache


@cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def give_back_freed_memory(pinned: bool = False) -> None:
    """Collect garbage (tensors held by reference cycles), then trim the C heap where the platform can. `pinned`: also
    give back the pinned host blocks torch has cached (`empty_pinned_host_cache`): after an arena is unpinned or
    replaced, and when a trainer closes.

    Called where the memory plan says memory is gone: after each checkpoint and LoRA save (their CPU copies are
    thousands of 0.1-1.6 MB tensors below glibc's mmap threshold: the H100 run measured ~1.2 GiB left in the heap),
    after the swapper fills its arena, after a trainer closes, and when the VAE or a text encoder is parked."""
    gc.collect()
    if pinned:
        empty_pinned_host_cache()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def empty_pinned_host_cache() -> None:
    """Give the pinned (page-locked) host blocks that torch's caching host allocator keeps after their tensors are
    freed back to the system. Without it a re-init after a 27-swapped run held its old 11.26 GiB arena for the life of
    the process (the H100 run). A no-op where CUDA was never initialised (nothing was pinned) and on a torch without
    `torch._C._host_emptyCache`."""
    import torch

    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None and torch.cuda.is_initialized():
        empty()


def host_ram_bytes() -> int | None:
    """This machine's RAM in bytes, or what $QWEN_LORA_HOST_RAM_GB says (GiB: plan for less than the machine
    has, when it is shared); the container's memory limit when that is lower; None when unknown."""
    override = os.environ.get("QWEN_LORA_HOST_RAM_GB", "").strip()
    if override:
        from .errors import UserInputError

        try:
            value = float(override)
        except ValueError:
            value = float("nan")
        if not value > 0:
            raise UserInputError(f"QWEN_LORA_HOST_RAM_GB={override!r} must be a positive number of GiB (e.g. 32), "
                                 "or unset to use the machine's RAM.")
        return int(value * (1 << 30))
    total = None
    try:
        import psutil

        total = psutil.virtual_memory().total
    except ImportError:
        if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:  # cgroup v2: "max" when unlimited
            limit = f.read().strip()
        if limit.isdigit() and (total is None or int(limit) < total):
            total = int(limit)
    except OSError:
        pass
    return total
