"""Give freed host memory back to the operating system.

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
