"""A block of bytes that the processes of one machine map together: one writer creates and fills it, readers map it
read-only, and the operating system frees it when the last process that maps it ends, however it ends.

Per platform (`SharedSegment.create` picks the branch; `handle` is what a reader needs to find it, picklable):
- Linux: an anonymous memory file (memfd_create). It never has a name in /dev/shm, so nothing can leak there,
  even when every process is killed with SIGKILL: its pages belong to the open descriptors and mappings, and go
  with the last of them. A reader opens the writer's descriptor through /proc/<pid>/fd/<n> (same user).
- Windows: a named mapping of the paging file (mmap's `tagname`). Windows frees it when its last handle closes,
  also when a process is killed. (Not tested here: this machine is Linux.)
- Other POSIX systems (macOS): a file in the temporary folder, mapped by every process and unlinked by the writer
  as soon as all have mapped it (`seal`); a SIGKILL between creation and `seal` can leave that file behind.

A reader's mapping is read-only: a process with a stray write faults (the kernel stops it) instead of changing what
the other processes compute with; a dying process changes nothing in the pages.
"""

from __future__ import annotations

import mmap
import os
import sys
import tempfile
import uuid
import warnings

import torch

SEGMENT_NAME = "trainer-core-host-copy"  # how the mapping shows in /proc/<pid>/maps (memfd:<name>)


def _names_host_copy(proc_fd: str) -> bool:
    try:
        return os.readlink(proc_fd).startswith(f"/memfd:{SEGMENT_NAME}")
    except OSError:
        return False


class SharedSegment:
    """`nbytes` bytes mapped in this process; `tensor` is a uint8 view of all of them (read-only for a reader)."""

    def __init__(self, memory: mmap.mmap, nbytes: int, handle: tuple, writable: bool, fd: int | None = None,
                 path: str | None = None):
        self.memory, self.nbytes, self.handle, self.writable = memory, nbytes, handle, writable
        self._fd, self._path = fd, path
        with warnings.catch_warnings():  # a read-only mapping: torch warns that the tensor must not be written
            warnings.simplefilter("ignore", UserWarning)
            self.tensor = torch.frombuffer(memory, dtype=torch.uint8, count=nbytes) if nbytes else \
                torch.empty(0, dtype=torch.uint8)

    @classmethod
    def create(cls, nbytes: int) -> SharedSegment:
        """A new segment of `nbytes` zero bytes, writable by this process."""
        size = max(nbytes, 1)  # a mapping of 0 bytes is refused
        if sys.platform.startswith("linux") and hasattr(os, "memfd_create"):
            fd = os.memfd_create(SEGMENT_NAME, os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
            memory = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            return cls(memory, nbytes, ("memfd", os.getpid(), fd, size), True, fd=fd)
        if sys.platform == "win32":
            tag = f"{SEGMENT_NAME}-{uuid.uuid4().hex}"
            memory = mmap.mmap(-1, size, tagname=tag, access=mmap.ACCESS_WRITE)
            return cls(memory, nbytes, ("tagname", tag, size), True)
        path = os.path.join(tempfile.gettempdir(), f"{SEGMENT_NAME}-{uuid.uuid4().hex}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, size)
        memory = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        return cls(memory, nbytes, ("path", path, size), True, fd=fd, path=path)

    @classmethod
    def attach(cls, handle: tuple, nbytes: int) -> SharedSegment:
        """The segment another process of this machine created (its `handle`), mapped read-only."""
        kind, size = handle[0], handle[-1]
        if kind == "tagname":
            memory = mmap.mmap(-1, size, tagname=handle[1], access=mmap.ACCESS_READ)
            return cls(memory, nbytes, handle, False)
        where = f"/proc/{handle[1]}/fd/{handle[2]}" if kind == "memfd" else handle[1]
        if kind == "memfd" and not _names_host_copy(where):  # a descriptor number closed and maybe used again
            raise RuntimeError(f"{where} is no longer the host copy (sealed before this process attached)")
        fd = os.open(where, os.O_RDONLY)
        try:
            memory = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)  # the mapping keeps the pages
        return cls(memory, nbytes, handle, False)

    def read_only(self) -> SharedSegment:
        """The writer's segment mapped again, read-only; the new mapping takes over what `seal` drops (the writable
        one is unmapped when its last view goes)."""
        again = SharedSegment.attach(self.handle, self.nbytes)
        again._fd, again._path, self._fd, self._path = self._fd, self._path, None, None
        return again

    def seal(self) -> None:
        """Once every process has mapped the segment: drop its name and descriptor, keeping only the mappings, so
        the pages go with the last process that maps them."""
        if self._path is not None:
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass
            self._path = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
