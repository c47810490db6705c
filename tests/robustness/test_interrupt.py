"""Cancel during a chunk stops at the next step boundary, checkpoints, and the next queue continues;
a trainer lost with the host (restart) is rebuilt from its checkpoint, not restarted."""

import json

import pytest
import torch

import host_standin
from conftest import pack_module
from graph_runner import GraphRunner
from test_nodes import tiny_prompt


@pytest.fixture
def output_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    return tmp_path / "output"


def adapter(trainer):
    return {n: p.detach().clone() for n, p in zip(trainer.built.param_names, trainer.built.params)}


def reference_adapter(pack, tmp_path, demo_folder, chunks):
    """The same graph queued with these chunk sizes and no interruption, in another run folder."""
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    prompt = tiny_prompt(tmp_path / "ref", demo_folder)
    prompt["6"]["inputs"]["run_name"] = "reference"
    for steps in chunks:
        prompt["7"]["inputs"]["steps"] = steps
        trainer = runner.run(prompt)["7"][0]
    result = adapter(trainer)
    pack_module(pack, "trainer_core.runs.registry").release("reference")
    return result


@pytest.mark.slow
@pytest.mark.parametrize("base_exception", [False, True], ids=["exception-0.3.64", "baseexception-0.33"])
def test_cancel_stops_at_a_step_boundary_checkpoints_and_continues(pack, tmp_path, demo_folder, output_dirs,
                                                                   monkeypatch, base_exception):
    # The train node updates its progress bar (total 5) after each step: cancel after the 2nd.
    exc, _ = host_standin.install(monkeypatch, interrupt_at=(5, 2), base_exception=base_exception)
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    prompt = tiny_prompt(tmp_path, demo_folder, steps=5)
    with pytest.raises(exc):
        runner.run(prompt)
    runs = pack_module(pack, "trainer_core.runs.registry")
    run_name = prompt["6"]["inputs"]["run_name"]
    trainer = runs.find(run_name)
    assert trainer.step == 2
    run_dir = output_dirs / "qwen_lora_training" / "runs" / run_name
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["step"] == 2

    outputs = runner.run(prompt)  # queue again: the same trainer goes on
    assert outputs["7"][0] is trainer and trainer.step == 7
    got = adapter(trainer)  # before the reference run, which (one run at a time) releases this one
    expected = reference_adapter(pack, tmp_path, demo_folder, chunks=(2, 5))
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    runs.release(run_name)


@pytest.mark.slow
def test_restart_rebuilds_the_trainer_from_its_checkpoint(pack, tmp_path, demo_folder, output_dirs):
    prompt = tiny_prompt(tmp_path, demo_folder, steps=3)
    GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)
    runs = pack_module(pack, "trainer_core.runs.registry")
    run_name = prompt["6"]["inputs"]["run_name"]
    runs.release(run_name)  # the server restarted: nothing of the run is left in memory

    fresh = GraphRunner(pack.NODE_CLASS_MAPPINGS)  # and every cached output is gone
    outputs = fresh.run(prompt)
    assert outputs["6"][1].startswith(f"resumed run '{run_name}' from its checkpoint at step 3")
    assert outputs["7"][0].step == 6
    got = adapter(outputs["7"][0])  # before the reference run, which (one run at a time) releases this one
    expected = reference_adapter(pack, tmp_path, demo_folder, chunks=(3, 3))
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    runs.release(run_name)
