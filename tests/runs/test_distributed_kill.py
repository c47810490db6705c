"""A torchrun run where one process is killed mid-run (SIGKILL, as the kernel's OOM killer does): the process that
survives says what happened and which checkpoint resumes the run, instead of leaving only torchrun's exit code;
the checkpoint it names is complete and the same command resumes from it. Both processes mapped one host copy of
the frozen weights, and neither the killed process nor the one that stopped on its error leaves shared memory in
/dev/shm.

One launch of 2 processes (each pays its imports). The same across two machines (two torchrun node groups over
loopback, one of which is killed whole, launcher and process) rides in test_distributed.py's two-machine launch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from test_headless import tiny_run_file


def children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


def rank_of(pid: int) -> int | None:
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if entry.startswith(b"RANK="):
            return int(entry[5:])
    return None


def host_copy_inodes(pid: int) -> set[int]:
    """The inodes of the shared host copy's mappings in process `pid` (streaming/shared_segment.py)."""
    return {int(line.split()[4]) for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if "memfd:trainer-core-host-copy" in line}


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def newest_step(checkpoints: Path) -> int:
    try:
        return int(json.loads((checkpoints / "latest.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1  # none yet, or being replaced (atomically: the next poll reads it)


@pytest.mark.slow  # a torchrun launch of 2 processes, each paying its imports
def test_a_killed_process_leaves_a_message_naming_the_intact_checkpoint(tmp_path, demo_folder):
    config = tiny_run_file(tmp_path / "config", demo_folder, train={"steps": 100000, "checkpoint_every": 2})
    output = tmp_path / "out"
    shm_before = shm_names()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "trainer_core",
         "train", "--config", str(config), "--output", str(output)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoints = output / "t" / "checkpoints"
    try:
        # Training for a few steps (the run would take hours). The newest checkpoint's step, not a folder's name: only
        # the newest two are kept, and on an idle machine step 4's folder is pruned before a poll can see it.
        deadline = time.monotonic() + 600
        while newest_step(checkpoints) < 4:
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, "the run wrote no checkpoint of step 4 or later in 600 s"
            time.sleep(0.2)
        ranks = {rank_of(pid): pid for pid in children(launcher.pid)}
        # Both processes map one host copy of the frozen weights (the same memory file).
        inodes = [host_copy_inodes(ranks[r]) for r in (0, 1)]
        assert inodes[0] == inodes[1] and len(inodes[0]) == 1, inodes
        os.kill(ranks[1], signal.SIGKILL)
        stdout, stderr = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0
    # The killed process and the one that stopped on its error left no shared memory behind.
    assert shm_names() <= shm_before
    lines = [line for line in stderr.splitlines() if line.startswith("error: process 0 of 2:")]
    assert len(lines) == 1, stderr[-3000:]
    message = lines[0]
    assert "another process of this run stopped during step" in message and "run the same command to resume" in message
    saved = int(message.split("The newest checkpoint, step ")[1].split(" ")[0])
    assert saved >= 4 and f"in {checkpoints}" in message
    # The checkpoint named is complete: one process resumes it (another world size: the documented note).
    from trainer_core.runs.cli import main

    config.write_text(config.read_text().replace("steps = 100000", f"steps = {saved + 1}"))
    assert main(["train", "--config", str(config), "--output", str(output)]) == 0
    assert (checkpoints / f"step_{saved + 1:06d}").is_dir()
