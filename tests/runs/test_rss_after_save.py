"""Host memory given back where the plan says it is gone (core/host_memory.give_back_freed_memory after a checkpoint,
a LoRA save and a trainer's close): the resident memory of a fresh process after each, against the memory plan's host
figure of that phase, on the tiny model and on one block of Qwen-Image's real width (bf16, as the plan counts it). The
pinned host cache (`empty_pinned_host_cache`) has nothing to give on the CPU: the device check measures that part."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("rss_after_save_worker.py")


def measure(*args: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(WORKER), *args], capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("args", [(), ("--real-width", "1")], ids=["tiny", "real-width block"])
def test_resident_memory_after_a_checkpoint_a_save_and_close_is_within_the_plan(args):
    found = measure(*args)
    measured, planned = found["measured"], found["planned"]
    # after the checkpoint (the train phase's last act) and the LoRA file: within what the plan holds for them
    assert measured["checkpoint"] <= planned["train"]
    assert measured["save"] <= planned["save"]
    # closed: the training state is gone, so no more than the save phase planned, and no more than before close
    assert measured["close"] <= min(planned["save"], measured["save"])
