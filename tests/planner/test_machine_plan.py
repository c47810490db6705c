"""Several processes on one machine: the planner's machine host RAM (planner/machine.py: one shared host copy of the
frozen weights, counted once), the refusal before anything loads, the `plan --gpus` table, and the process group's
backend per platform (training/distributed.process_group_options). Pure arithmetic and pure functions."""

from __future__ import annotations

import pytest

from trainer_core.core.errors import UserInputError
from trainer_core.planner import GIB, PlanInputs, check_run, plan_phases
from trainer_core.planner.machine import plan_machine
from trainer_core.training.distributed import process_group_options

INPUTS = PlanInputs(blocks_to_swap=29, dataset_images=40)


def terms(phase, name: str) -> int:
    return sum(t.bytes for t in phase.host if t.name.startswith(name))


def test_the_shared_copy_is_counted_once_and_every_process_adds_its_own_part():
    phases = plan_phases(INPUTS, ram_bytes=64 * GIB, gpu_budget_bytes=16 * GIB)
    machines = {n: plan_machine(phases, n) for n in (1, 2, 4)}
    for name, phase in phases.phases.items():
        one = machines[1].host_bytes(name)
        # One process: the single-process plan, less the arena's power-of-two rounding and the chunk being filled at
        # init (a shared copy is exact, and has no arena).
        assert one == phase.host_bytes - terms(phase, "pinned arena slack") - terms(phase, "pinned chunk being filled")
        each = sum(t.bytes for t in machines[1].phases[name].each)
        for n in (2, 4):
            assert machines[n].host_bytes(name) == one + (n - 1) * each
        # The masters are in the shared part, once, whatever the count.
        assert sum(t.bytes for t in machines[4].phases[name].shared) == terms(phase, "CPU master of swapped blocks")
    train = machines[2].phases["train"]
    assert [t.name for t in train.each] == ["process baseline", "cached latents + prompt embeddings"]
    assert machines[2].gpu_bytes == phases.training.gpu_total  # every GPU holds what one GPU holds alone


def test_init_refuses_processes_the_machines_ram_cannot_hold_and_names_how_many_would_fit():
    fits_one = plan_phases(INPUTS, ram_bytes=20 * GIB, gpu_budget_bytes=16 * GIB)
    machine = plan_machine(fits_one, 1)
    assert machine.fits()
    most = machine.most_processes()
    assert plan_machine(fits_one, most).fits() and not plan_machine(fits_one, most + 1).fits()
    check_run(INPUTS, auto=False, gpu_budget_bytes=None, ram_bytes=20 * GIB, processes=most)
    with pytest.raises(UserInputError) as error:
        check_run(INPUTS, auto=False, gpu_budget_bytes=None, ram_bytes=20 * GIB, processes=most + 1)
    message = str(error.value)
    assert f"{most + 1} processes on this machine" in message and f"start at most {most} process" in message
    assert "shared host copy" in message and "per process (process baseline" in message


def test_plan_prints_the_machines_host_ram_and_each_gpu(capsys):
    from trainer_core.runs.cli import main

    assert main(["plan", "--gpus", "2", "--ram-gb", "32", "--budget-gb", "16"]) == 0
    printed = capsys.readouterr().out
    assert "Host RAM of the machine, 2 processes" in printed
    assert "machine peak (" in printed and "= shared once + process 0's own + 2 x each" in printed
    assert "the same on each of the 2 GPUs" in printed and ": fits" in printed


@pytest.mark.parametrize("platform, cuda, nccl, expected", [
    ("linux", True, True, ("nccl", {})),
    ("linux", False, True, ("gloo", {})),
    ("linux", True, False, ("gloo", {})),  # a torch built without NCCL
    ("darwin", False, False, ("gloo", {})),
    ("win32", True, False, ("gloo", {"init_method": "env://?use_libuv=0"})),
    ("win32", True, True, ("gloo", {"init_method": "env://?use_libuv=0"})),  # never NCCL on Windows
    ("win32", False, False, ("gloo", {"init_method": "env://?use_libuv=0"})),
])
def test_the_process_group_backend_and_options_per_platform(platform, cuda, nccl, expected):
    assert process_group_options(platform, cuda, nccl) == expected
