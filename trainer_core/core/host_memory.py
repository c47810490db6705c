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


def give_back_freed_memory() -> None:
    """Collect garbage (tensors held by reference cycles), then trim the C heap where the platform can."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


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
