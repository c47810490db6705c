"""Run a measurement under a memory cap, so that an overshoot fails the script, not the machine.

Two guards, both on:
- a memory cgroup of its own (Linux, cgroup v1 or v2, where this process may create one): the kernel
  kills the script (exit 137) when its memory would pass the cap, before the machine runs short;
- a watchdog thread that reads the process' resident memory every 20 ms and ends the script with a clear
  message when it passes the cap (where no cgroup can be made, e.g. in an unprivileged container).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

GIB = 1 << 30


def _own_cgroup() -> tuple[str, Path] | None:
    """('v1' | 'v2', the folder of this process' memory cgroup), if there is one we can read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if folder.is_dir():
                return "v1", folder
    for line in lines:
        if line.startswith("0::"):
            folder = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            if (folder / "memory.max").exists() or (folder / "cgroup.controllers").exists():
                return "v2", folder
    return None


def make_cgroup(limit_bytes: int) -> Path | None:
    """A new child memory cgroup limited to `limit_bytes` (no swap where the kernel lets us say so), or None
    when none can be made here."""
    found = _own_cgroup()
    if found is None:
        return None
    version, parent = found
    child = parent / f"qwen-lora-cap-{os.getpid()}"
    try:
        child.mkdir(exist_ok=True)
        if version == "v1":
            (child / "memory.limit_in_bytes").write_text(str(limit_bytes))
            swap = child / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(str(limit_bytes))
        else:
            (child / "memory.max").write_text(str(limit_bytes))
            if (child / "memory.swap.max").exists():
                (child / "memory.swap.max").write_text("0")
    except OSError:
        _remove(child)
        return None
    return child


def _remove(cgroup: Path) -> None:
    try:
        cgroup.rmdir()
    except OSError:
        pass


def run_capped(argv: list[str], limit_gib: float, log=print) -> int:
    """Run `argv` in a cgroup capped at `limit_gib` (when one can be made) and return its exit status; the
    command should start `start_watchdog` itself too."""
    limit = int(limit_gib * GIB)
    cgroup = make_cgroup(limit)
    log(f"memory cap {limit_gib:g} GiB: " + (f"cgroup {cgroup} and a watchdog" if cgroup else
                                              "watchdog only (no memory cgroup could be made here)"))

    def enter():
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    try:
        return subprocess.run(argv, preexec_fn=enter).returncode
    finally:
        if cgroup is not None:
            _remove(cgroup)


def rss_bytes() -> int:
    """This process' resident memory now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def start_watchdog(limit_bytes: int, interval: float = 0.02) -> threading.Thread:
    def watch():
        while True:
            rss = rss_bytes()
            if rss > limit_bytes:
                sys.stderr.write(f"\nmemory cap: resident memory {rss / GIB:.2f} GiB passed the cap of "
                                 f"{limit_bytes / GIB:.2f} GiB; stopping.\n")
                sys.stderr.flush()
                os._exit(3)
            time.sleep(interval)

    thread = threading.Thread(target=watch, name="memory-cap", daemon=True)
    thread.start()
    return thread
