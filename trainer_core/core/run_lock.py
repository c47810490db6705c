"""One trainer per run folder: an exclusive lock on `<run folder>/.lock`.

Two trainers writing checkpoints into one folder would interleave steps and prune each other's files,
so a second trainer on the same folder, in this process or another, gets a clear error instead. The lock
is the operating system's (flock on POSIX, LockFileEx through msvcrt on Windows) on an open file handle:
it dies with the process that holds it, so a lock left by a killed process is simply taken over. The
file itself stays (an unlocked file means nothing); it holds the holder's pid and host for the message.
"""

from __future__ import annotations

import gc
import os
import socket
from pathlib import Path

from .errors import UserInputError

LOCK_NAME = ".lock"

if os.name == "nt":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _try_lock(fd: int) -> bool:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        # flock (not fcntl's record locks): a second open file in the SAME process conflicts too.
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            return False

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


class RunLock:
    """The lock of one run folder. `acquire()` raises a `UserInputError` naming the holder when taken."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None
        self._owner = ""

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, owner: str = "") -> None:
        if self._fd is not None:
            return
        self._owner = owner
        self.run_dir.mkdir(parents=True, exist_ok=True)
        collected = False
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if not _try_lock(fd):
                holder = _read_holder(fd)
                os.close(fd)
                if not collected:
                    # Held in this process by a trainer dropped without close() but kept by a reference cycle? Its
                    # lock goes when the cyclic garbage collector frees it: collect now and try once more.
                    gc.collect()
                    collected = True
                    continue
                raise UserInputError(
                    f"the run folder {self.run_dir} is in use by another trainer ({holder}). Two trainers on one run "
                    "folder would overwrite each other's checkpoints: use another run_name, or stop the other "
                    "trainer (release it, or end that process) first."
                )
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the file was removed or replaced between open and lock: lock the one there now
        # Record who holds it (after the lock byte range on Windows: write from offset 1 on).
        os.lseek(fd, 1, os.SEEK_SET)
        os.ftruncate(fd, 1)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} {owner}".strip().encode())
        self._fd = fd

    def still_held(self) -> bool:
        """Whether the lock file we hold is still the one at `path` (not deleted, replaced or moved away with
        its folder): a writer checks this before each checkpoint, so a second trainer that took a new lock
        file never shares the folder with it."""
        return self._fd is not None and _same_file(self._fd, self.path)

    def reacquire(self) -> bool:
        """After `still_held` turned False: lock the file at `path` again if nobody else holds it (the run folder
        was deleted and is being recreated); False when another trainer has it now."""
        self.release()
        try:
            self.acquire(self._owner)
        except UserInputError:
            return False
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                _unlock(fd)
            finally:
                os.close(fd)

    def __del__(self):  # a trainer dropped without close() must not keep its folder locked
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _read_holder(fd: int) -> str:
    try:
        os.lseek(fd, 1, os.SEEK_SET)
        text = os.read(fd, 400).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"
