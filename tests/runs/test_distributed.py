"""Data-parallel training on the CPU: `torchrun --nproc-per-node 2 -m trainer_core train` with the gloo backend.

Two launches of 2 processes that train (each new process pays its imports, so no more than two), and one that
stops before it reads a model file (C below):
  A  one node of 2 processes trains 8 steps (grad_accum_steps 2 per process, LoRA dropout on, a checkpoint at step
     4); its two processes share one host copy of the frozen weights (training/host_copy.py);
  B  two torchrun node groups of 1 process each (--nnodes 2, rendezvous on 127.0.0.1, as two machines): a copy of
     A's output folder without its step-8 checkpoint, resumed at step 4 with no end in sight; the second machine's
     run file names a cache folder of its own (a machine that does not see the first's), which it fills itself.
     Once B has written its checkpoint of step 8, the second machine goes at once (its launcher and process
     SIGKILLed, as a machine that loses power): the first machine's process stops with one line naming the newest
     checkpoint (the kill of one process of one machine: test_distributed_kill.py).
  C  two torchrun node groups whose run files differ in one setting (the learning rate): both processes stop before
     they read a model file, naming the setting, both machines and both values, and nothing is written.
A reads the tiny model's files: A's second process takes its frozen weights from the first's shared copy instead of
the file (test_shared_host.py counts the bytes it reads: none).
B's step-8 checkpoint (LoRA, optimizer state, generators) equals A's bit for bit: the same world size resumes exactly
across a change of the number of machines, and B's processes each hold their own host copy where A's shared one, so
the shared copy trains what private copies train. Neither launch leaves anything in /dev/shm. A one-process run
with 2 x the accumulation (grad_accum_steps 4), the same samples per step, ends with a LoRA equal to A's
within float rounding: measured on this machine, the largest difference after 8 steps is about 1e-8 (3e-8
after 20 steps, on weights up to 0.2; the loss curves agree to 1e-7); the test allows 1e-6. It is not 0 because
the gradients are summed in another order: ((g0 + g1) + g2) + g3 in one process, (g0 + g2) + (g1 + g3) over two.
(With grad_accum_steps 1 per process, two processes and one with 2 x the accumulation were equal bit for bit.)
A one-process run also resumes A's step-4 checkpoint (another world size: the documented note, same samples), and
the checkpoint that B's surviving process names.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO
from test_headless import tiny_run_file

pytestmark = pytest.mark.slow  # two torchrun launches of 2 processes, each paying its imports

TOLERANCE = 1e-6  # largest LoRA weight difference allowed between 2 processes and 1 with 2 x the accumulation
STEPS = 8


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def torchrun(config: Path, output: Path, host_copy: str = "shared") -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "trainer_core", "train", "--config", str(config), "--output", str(output)]
    before = shm_names()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "TRAINER_CORE_HOST_COPY": host_copy})
    assert shm_names() <= before  # the shared host copy leaves nothing in /dev/shm
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


def newest_step(checkpoints: Path) -> int:
    try:
        return int(json.loads((checkpoints / "latest.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1  # none yet, or being replaced (atomically: the next poll reads it)


def two_nodes_until_the_second_goes(configs: tuple[Path, Path], output: Path, after_step: int) -> tuple[str, str]:
    """Two torchrun node groups of one process each on this machine, their rendezvous on 127.0.0.1 (gloo), as two
    machines would run: --nnodes 2 --node-rank 0|1, node k with run file configs[k]. Once the run's checkpoint of
    `after_step` or later is written, the second machine goes at once: its launcher and its process (torchrun starts
    it in a session of its own), SIGKILL to both. The first machine's launcher must then end within 300 s (the gloo
    connection to a killed process closes at once, where an unreachable machine would take the process group's
    timeout, distributed.STEP_TIMEOUT) and with an error. Returns what node 0 printed (stdout, stderr)."""
    port = free_port()
    before = shm_names()
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank",
         str(node), "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "trainer_core", "train",
         "--config", str(configs[node]), "--output", str(output)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    checkpoints = output / "t" / "checkpoints"
    try:
        deadline = time.monotonic() + 600
        # Polled often: a checkpoint every 4 steps keeps step 8's until step 16's is written, far more than the
        # kill's delay.
        while newest_step(checkpoints) < after_step:
            for launcher in launchers:
                assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, f"the run wrote no checkpoint of step {after_step} or later in 600 s"
            time.sleep(0.02)
        for pid in [launchers[1].pid, *children(launchers[1].pid)]:
            os.kill(pid, signal.SIGKILL)
        launchers[1].communicate(timeout=60)
        stdout, stderr = launchers[0].communicate(timeout=300)
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                for pid in children(launcher.pid):
                    os.kill(pid, signal.SIGKILL)
                launcher.kill()
    assert launchers[0].returncode != 0
    assert shm_names() <= before  # the killed process and the one that stopped on its error left none
    return stdout, stderr


def state(output: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(output / "t" / "checkpoints" / f"step_{step:06d}" / "state.safetensors"))


def lora_weights(output: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state(output, step).items() if k.startswith("lora.")}


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def run_file(folder: Path, images: Path, accum: int, files: dict[str, Path]) -> Path:
    # The tiny model's files (export-tiny), so that the transformer is read from its file: the second process of a
    # machine takes its frozen weights from the first's shared copy instead (host_copy.attach_before_load).
    # float32 blocks (float8 is slow on a CPU); rank 4 on attention+mlp, AdamW8bit; dropout on: its masks must
    # follow the micro-batch, not the process. One block streamed: the swapper copies it from the shared host copy.
    model = {"source": "", "transformer": str(files["transformer_bf16"]), "text_encoder": str(files["text_encoder_bf16"]),
             "vae": str(files["vae"]), "tokenizer": str(files["tokenizer"])}
    return tiny_run_file(folder, images, model=model, lora={"dropout": 0.1},
                         train={"steps": STEPS, "grad_accum_steps": accum, "checkpoint_every": 4, "blocks_to_swap": 1})


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, demo_folder, tiny_files):
    """Launch A: 2 processes, 8 steps. Returns (run file folder, output folder, what it printed)."""
    folder = tmp_path_factory.mktemp("ddp")
    config = run_file(folder / "config", demo_folder, accum=2, files=tiny_files)
    result = torchrun(config, folder / "A")
    return config, folder / "A", result.stdout


def test_two_processes_train_what_one_process_trains_with_twice_the_accumulation(two_processes, tmp_path,
                                                                                 demo_folder, tiny_files, capsys):
    from trainer_core.runs.cli import main

    config, a, printed = two_processes
    assert "2 processes" in printed and f"step {STEPS}/{STEPS}" in printed
    assert "frozen weights in one host copy for this machine's processes" in printed
    assert printed.count("started run 't' at step 0") == 1  # process 0 alone reports (and writes)
    assert sorted(p.name for p in (a / "t" / "checkpoints").glob("step_*")) == ["step_000004", "step_000008"]
    assert json.loads((a / "t" / "checkpoints" / "step_000008" / "state.json").read_text())["processes"] == 2

    one = run_file(tmp_path / "config", demo_folder, accum=4, files=tiny_files)
    assert main(["train", "--config", str(one), "--output", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    difference = largest_difference(lora_weights(a), lora_weights(tmp_path / "one"))
    print(f"largest LoRA weight difference, 2 processes vs 1 with 2 x accumulation: {difference:.3g}")
    assert difference <= TOLERANCE
    losses_a = json.loads((a / "t" / "losses.json").read_text())["loss"]
    losses_one = json.loads((tmp_path / "one" / "t" / "losses.json").read_text())["loss"]
    assert [s for s, _ in losses_a] == [s for s, _ in losses_one] == list(range(1, STEPS + 1))
    assert max(abs(x - y) for (_, x), (_, y) in zip(losses_a, losses_one)) < 1e-5


def test_two_machines_resume_a_checkpoint_of_one_bit_exactly_and_stop_with_a_message_when_one_goes(
        two_processes, tmp_path, demo_folder, tiny_files, capsys):
    from trainer_core.runs.cli import main

    config, a, _ = two_processes
    for name in ("B", "C"):  # A's output as it was after step 4
        shutil.copytree(a, tmp_path / name)
        shutil.rmtree(tmp_path / name / "t" / "checkpoints" / "step_000008")
        (tmp_path / name / "t" / "checkpoints" / "latest.json").write_text(json.dumps({"dir": "step_000004", "step": 4}))
        (tmp_path / name / "t" / f"t_{STEPS:06d}.safetensors").unlink()
    # B: two node groups of one process each (as on two machines), so every process holds its own host copy of the
    # frozen weights, where A's two processes on one node shared one. Same state at step 8, bit for bit. The second
    # machine does not see the first's cache folder (its run file names an empty one of its own): its first process
    # encodes every entry there, the same entries, under the same content keys. B has no end in sight (the steps
    # setting changes nothing a step computes: a constant learning rate), so that it is mid-run when a machine goes.
    endless = config.read_text().replace(f"\nsteps = {STEPS}\n", "\nsteps = 100000\n")
    assert endless != config.read_text()
    own_cache = tmp_path / "node1_cache"
    node0, node1 = tmp_path / "node0" / "run.toml", tmp_path / "node1" / "run.toml"
    node0.parent.mkdir(), node1.parent.mkdir()
    assert "[cache]" not in endless
    node0.write_text(endless)
    node1.write_text(endless + f"\n[cache]\ncache_folder = {json.dumps(str(own_cache))}\n")
    printed, errors = two_nodes_until_the_second_goes((node0, node1), tmp_path / "B", after_step=STEPS)
    assert "one host copy for this machine's processes" not in printed
    assert "resumed run 't' from its checkpoint at step 4" in printed
    assert "cache" in printed and "0 encoded" in printed  # nothing encoded again on the first machine

    def entries(folder: Path) -> set[str]:
        return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert entries(own_cache) and entries(own_cache) == entries(tmp_path / "B" / "cache")
    b_state, a_state = state(tmp_path / "B", STEPS), state(a, STEPS)
    assert b_state.keys() == a_state.keys()
    assert all(torch.equal(b_state[k], a_state[k]) for k in a_state)  # LoRA, optimizer state, generators

    # The second machine went: the first's process stopped with one line naming the newest checkpoint.
    lines = [line for line in errors.splitlines() if line.startswith("error: process 0 of 2:")]
    assert len(lines) == 1, errors[-3000:]
    checkpoints = tmp_path / "B" / "t" / "checkpoints"
    assert "another process of this run stopped during step" in lines[0]
    saved = int(lines[0].split("The newest checkpoint, step ")[1].split(" ")[0])
    assert saved >= STEPS and f"in {checkpoints}" in lines[0] and "run the same command to resume" in lines[0]
    # The checkpoint named is complete: one process resumes it (another world size: the documented note).
    node0.write_text(endless.replace("\nsteps = 100000\n", f"\nsteps = {saved + 1}\n"))
    assert main(["train", "--config", str(node0), "--output", str(tmp_path / "B")]) == 0
    assert (checkpoints / f"step_{saved + 1:06d}").is_dir()

    # One process continues the 2-process checkpoint with grad_accum_steps 4: the same micro-batches per step.
    capsys.readouterr()
    one = run_file(tmp_path / "config", demo_folder, accum=4, files=tiny_files)
    assert main(["train", "--config", str(one), "--output", str(tmp_path / "C")]) == 0
    printed = capsys.readouterr().out
    assert ("the checkpoint of step 4 was written by 2 processes x grad_accum_steps 2, and 1 x 4 resume it: each "
            "step still takes 4 micro-batches, the same samples as before") in printed
    assert largest_difference(lora_weights(tmp_path / "C"), lora_weights(a)) <= TOLERANCE


def test_machines_whose_run_files_disagree_stop_before_step_1_naming_the_setting_machine_and_values(tmp_path,
                                                                                                   demo_folder):
    """Launch C. Before: both exited 0, their replicas held different weights after step 1, and process 0 saved a
    LoRA neither run file describes. Each machine's files may be elsewhere (here: its own dataset folder path and
    cache folder) and its GPUs hold the model its own way (blocks_to_swap): only the learning rate differs."""
    images = tmp_path / "images_on_node1"
    shutil.copytree(demo_folder, images)
    node0 = tiny_run_file(tmp_path / "node0", demo_folder, optimizer={"learning_rate": 0.001})
    node1 = tiny_run_file(tmp_path / "node1", images, optimizer={"learning_rate": 0.01},
                          train={"blocks_to_swap": 1}, cache={"cache_folder": str(tmp_path / "node1_cache")})
    port, output = free_port(), tmp_path / "out"
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank",
         str(node), "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "trainer_core", "train",
         "--config", str(config), "--output", str(output)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node, config in enumerate((node0, node1))]
    try:
        results = [launcher.communicate(timeout=300) for launcher in launchers]
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
    assert all(launcher.returncode != 0 for launcher in launchers)
    for _, errors in results:
        line = next(line for line in errors.splitlines() if line.startswith("error: the run settings"))
        assert ("[optimizer] learning_rate is 0.001 on machine 0 (process 0 on " in line and f"{node0})" in line and
                "and 0.01 on machine 1 (process 1 on " in line and f"{node1})" in line), line
        assert "blocks_to_swap is" not in line and "folder is" not in line and "Nothing was trained" in line
    assert not (output / "t").exists() and not (output / "cache").exists()  # nothing read, cached or written
