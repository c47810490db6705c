"""One trainer works in one place at a time (trainer_core/training/busy.py).

Real threads on a real tiny trainer: the first caller trains and stops inside its own step callback until the
second caller has tried its node; the second is refused with the run's name, and the first one's losses and
weights equal those of a run nobody disturbed. Events order the two threads: no sleeps, no timing.
"""

import threading

import pytest
import torch

from conftest import adapter_snapshot, cached_demo
from trainer_core.runs import registry as runs
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.training import Trainer

STEPS = 4


def make_trainer(cache_dir, folder, run_name, run_dir=None):
    components = build_tiny_components(seed=0, storage="float32")
    cached = cached_demo(components, folder, cache_dir, preview_prompts=["a red circle"])
    return Trainer(components, cached, LoraConfig(rank=4, alpha=4.0, targets="all"),
                   OptimizerConfig(learning_rate=1e-3), TrainConfig(run_name=run_name, seed=5), run_dir=run_dir)


def train_in_thread(trainer, at_step=2):
    """Start trainer.train(STEPS) in a thread that pauses after step `at_step` until `go` is set.
    Returns (thread, paused, go, result): result gets 'report' or 'error'."""
    paused, go, result = threading.Event(), threading.Event(), {}

    def on_step(report):
        if report.step == at_step:
            paused.set()
            assert go.wait(timeout=600)  # a safety net for a broken test only: `go` is set right after the tries

    def work():
        try:
            result["report"] = trainer.train(STEPS, on_step=on_step)
        except BaseException as e:  # noqa: BLE001 (reported to the test below)
            result["error"] = e
        finally:
            paused.set()

    thread = threading.Thread(target=work)
    thread.start()
    assert paused.wait(timeout=600)
    return thread, go, result


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory, demo_folder):
    cache = tmp_path_factory.mktemp("busy_cache")
    trainer = make_trainer(cache, demo_folder, "calm")
    report = trainer.train(STEPS)
    return cache, report.losses, adapter_snapshot(trainer)


def assert_undisturbed(trainer, result, undisturbed):
    assert "error" not in result, result.get("error")
    _, losses, weights = undisturbed
    assert result["report"].losses == losses
    assert trainer.step == STEPS
    snapshot = adapter_snapshot(trainer)
    assert all(torch.equal(snapshot[n], weights[n]) for n in weights)


def test_a_second_train_steps_is_refused_by_name_and_the_first_goes_on(undisturbed, demo_folder, tmp_path):
    trainer = make_trainer(undisturbed[0], demo_folder, "busy_run", run_dir=tmp_path / "run")
    thread, go, result = train_in_thread(trainer)
    try:
        with pytest.raises(UserInputError) as refused:
            trainer.train(2)
    finally:
        go.set()
        thread.join()
    message = str(refused.value)
    assert "run 'busy_run'" in message and "busy with Train Steps" in message and "Wait until" in message
    assert_undisturbed(trainer, result, undisturbed)
    assert trainer.train(1).steps == 1  # free again once the first has finished


@pytest.mark.parametrize("node", ["preview", "save", "checkpoint", "release", "retire_by_new_run", "close"])
def test_other_nodes_during_train_steps_are_refused_and_training_is_undisturbed(undisturbed, demo_folder, tmp_path,
                                                                                node):
    run_dir = tmp_path / "run"
    opened = runs.open_run(*_run_inputs(undisturbed[0], demo_folder, "busy_" + node), run_dir=run_dir)
    trainer = opened.trainer
    thread, go, result = train_in_thread(trainer)
    try:
        with pytest.raises(UserInputError, match=f"run 'busy_{node}' .*busy with Train Steps"):
            if node == "preview":
                trainer.sample_preview("a red circle", width=32, height=32, steps=2)
            elif node == "save":
                trainer.save_lora(tmp_path / "mid.safetensors")
            elif node == "checkpoint":
                trainer.save_checkpoint()
            elif node == "release":
                runs.release(trainer.train_cfg.run_name)
            elif node == "retire_by_new_run":  # another run's Init Trainer on the same loaded model
                components, dataset, lora, optim, train = _run_inputs(undisturbed[0], demo_folder, "other")
                runs.open_run(trainer.components, dataset, lora, optim, train, run_dir=None)
            else:
                trainer.close()
    finally:
        go.set()
        thread.join()
    try:
        assert_undisturbed(trainer, result, undisturbed)
        assert not (tmp_path / "mid.safetensors").exists()
        assert runs.find(trainer.train_cfg.run_name) is trainer  # still the live run
        trainer.save_lora(tmp_path / "after.safetensors")  # and usable once training has finished
    finally:
        runs.release(trainer.train_cfg.run_name)


def _run_inputs(cache, folder, run_name):
    components = build_tiny_components(seed=0, storage="float32")
    cached = cached_demo(components, folder, cache, preview_prompts=["a red circle"])
    return (components, cached, LoraConfig(rank=4, alpha=4.0, targets="all"), OptimizerConfig(learning_rate=1e-3),
            TrainConfig(run_name=run_name, seed=5))


def test_train_steps_samples_and_saves_inside_itself(undisturbed, demo_folder, tmp_path):
    """Nested use in the training thread stays allowed: the step callback may preview and save."""
    trainer = make_trainer(undisturbed[0], demo_folder, "nested")
    saved = []

    def on_step(report):
        if report.step == 2:
            trainer.sample_preview("a red circle", width=32, height=32, steps=2)
            saved.append(trainer.save_lora(tmp_path / "inside.safetensors"))

    trainer.train(STEPS, on_step=on_step)
    assert saved and saved[0].exists()
    with pytest.raises(UserInputError, match="from its own callback"):
        trainer.train(1, on_step=lambda report: trainer.train(1))
