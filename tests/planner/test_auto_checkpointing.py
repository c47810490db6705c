"""gradient_checkpointing 'auto' as a run decides it (`for_run.check_run`, what training/setup.py hands the block
runner): the fewest recomputing blocks that fit the GPU budget at the swap count chosen, every block on the CPU or
without a budget; 'on' every block; and the settings still read the true/false of files saved before 'auto'."""

from pathlib import Path

import pytest

from trainer_core.core.config import TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.planner import GIB, PlanInputs
from trainer_core.planner.arch import real_arch
from trainer_core.planner.for_run import check_run
from trainer_core.runs.run_file import parse_run_tables

CUDA = PlanInputs(width=1024, height=1024, rank=32, device="cuda")


def _decide(gib: float | None, inputs: PlanInputs = CUDA, auto_checkpointing: bool = True):
    return check_run(inputs, auto=True, gpu_budget_bytes=None if gib is None else int(gib * GIB), ram_bytes=None,
                     auto_checkpointing=auto_checkpointing)


def test_auto_recomputes_no_block_at_80_gib_and_every_block_at_24():
    n = real_arch().num_blocks
    roomy = _decide(80)
    assert (roomy.blocks_to_swap, roomy.checkpointed_blocks) == (0, 0)
    assert roomy.checkpointing_note == f"checkpointing: 0 of {n} blocks recompute (auto, fits 80 GiB)"
    assert "checkpointing planned, no block recomputes" in roomy.text  # the plan the run trains under
    small = _decide(24)
    assert small.blocks_to_swap > 0 and small.checkpointed_blocks is None  # None: the runner's every block
    assert small.checkpointing_note == f"checkpointing: {n} of {n} blocks recompute (auto, blocks are swapped)"


def test_auto_between_them_keeps_some_blocks_and_the_plan_says_which():
    n = real_arch().num_blocks
    decision = _decide(48)
    k = decision.checkpointed_blocks
    assert decision.blocks_to_swap == 0 and 0 < k < n
    assert decision.checkpointing_note == f"checkpointing: {k} of {n} blocks recompute (auto, fits 48 GiB)"
    assert f"checkpointing in blocks 0..{k - 1}" in decision.text and "Every phase fits." in decision.text


def test_on_and_the_cpu_recompute_every_block_as_before_auto():
    on = _decide(80, auto_checkpointing=False)
    assert on.checkpointed_blocks is None and on.checkpointing_note is None
    cpu = _decide(None, PlanInputs(width=1024, height=1024, rank=32, device="cpu"))
    assert cpu.checkpointed_blocks is None
    n = real_arch().num_blocks
    assert cpu.checkpointing_note == f"checkpointing: {n} of {n} blocks recompute (auto, no GPU budget known)"


@pytest.mark.parametrize(("given", "read"), [(True, "on"), (False, "off"), ("auto", "auto"), ("On", "on"),
                                             ("false", "off")])
def test_old_true_false_values_load(given, read):
    train = TrainConfig(gradient_checkpointing=given)
    assert train.gradient_checkpointing == read and train.checkpointing == (read != "off")
    run = parse_run_tables({"model": {"source": "tiny"}, "dataset": [{"folder": "."}],
                            "train": {"gradient_checkpointing": given}}, Path("."))
    assert run.train.gradient_checkpointing == read


def test_a_bad_value_names_the_setting_and_its_choices():
    assert TrainConfig().gradient_checkpointing == "auto"
    with pytest.raises(UserInputError, match="gradient_checkpointing=.sometimes.*'auto'.*'on'.*'off'"):
        TrainConfig(gradient_checkpointing="sometimes")
    with pytest.raises(UserInputError, match=r"\[train\] gradient_checkpointing = 3"):
        parse_run_tables({"model": {"source": "tiny"}, "dataset": [{"folder": "."}],
                          "train": {"gradient_checkpointing": 3}}, Path("."))
