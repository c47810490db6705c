"""The run recipe: one live trainer per model set, retire and release free every tensor, a lock per run
folder, settings compared with the live run, and the nodes' graph on top of it."""

import gc
import json
import os
import signal
import subprocess
import sys
import weakref

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO, cached_demo, pack_module
from graph_runner import GraphRunner
from test_nodes import tiny_prompt
from trainer_core.training import checkpoint as ckpt
from trainer_core.core import files
from trainer_core.runs import registry as runs
from trainer_core.core.config import AUTO_SWAP, LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.training import Trainer

LORA = LoraConfig(rank=4, alpha=4.0)
OPTIM = OptimizerConfig(learning_rate=1e-3)


@pytest.fixture
def tiny_run(tmp_path, demo_folder, tiny_cache):
    """Opens runs on one tiny model set (two blocks, the last one swapped); releases what is left after."""
    components = build_tiny_components(seed=0, storage="float32")
    cached = cached_demo(components, demo_folder, tiny_cache)

    def open_(name="a", lora=LORA, optimizer=OPTIM, **train):
        settings = dict(run_name=name, seed=1, blocks_to_swap=1, checkpoint_every=0)
        settings.update(train)
        return runs.open_run(components, cached, lora, optimizer, TrainConfig(**settings), run_dir=tmp_path / name)

    yield open_, components
    runs.release_all()


def owned_tensors(trainer):
    """Weak references to every kind of tensor a trainer owns: adapter, gradients' targets, optimizer
    state, the swapper's GPU slots and its (pinned on CUDA) master arena."""
    swapper = trainer.built.runner.swapper
    tensors = [*trainer.built.params, *swapper.slots[0], *[c for c in swapper.arena.chunks if c is not None]]
    tensors += [v for state in trainer.built.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    assert len(tensors) > len(trainer.built.params) + 2
    return [weakref.ref(t) for t in tensors]


def test_release_frees_every_tensor_and_empties_the_registry(tiny_run):
    open_, components = tiny_run
    run = open_("a")
    run.trainer.train(2)
    refs = owned_tensors(run.trainer)
    message = runs.release("a")
    gc.collect()
    assert "released run 'a' at step 2" in message
    assert all(ref() is None for ref in refs)
    assert runs.live_runs() == [] and runs.find("a") is None
    assert not any(".lora_" in n for n in components.transformer.state_dict())
    # The trainer object may still be held (a cached node output): it refuses use and says why.
    with pytest.raises(UserInputError, match="run 'a' was released at step 2.*queue again"):
        run.trainer.train(1)
    # The run continues from its checkpoint, on the same model set.
    again = open_("a")
    assert again.action == "resumed" and again.trainer.step == 2


def test_a_second_run_on_the_model_set_retires_the_first_which_then_refuses_use(tiny_run, tmp_path):
    open_, _ = tiny_run
    first = open_("a").trainer
    first.train(1)
    refs = owned_tensors(first)
    second = open_("b").trainer
    gc.collect()
    assert all(ref() is None for ref in refs)
    assert runs.live_runs() == ["b"]
    for use in (lambda: first.train(1), lambda: first.save_lora(tmp_path / "x.safetensors"),
                lambda: first.sample_preview("a red circle on a white background", width=64, height=64, steps=1)):
        with pytest.raises(UserInputError, match="run 'a' was retired at step 1: run 'b' started training the "
                                                 "same loaded model.*run its Init\\s+Trainer again"):
            use()
    # 'a' was checkpointed with its own LoRA tensors when it was retired, so it can be resumed.
    tensors, meta, _ = ckpt.load_latest(tmp_path / "a")
    assert meta["step"] == 1 and sum(k.startswith("lora.") for k in tensors) == len(meta["param_names"]) > 0
    second.train(1)


def test_the_model_set_refuses_a_second_live_trainer_built_directly(tiny_run, demo_folder, tiny_cache):
    open_, components = tiny_run
    live = open_("a").trainer
    cached = cached_demo(components, demo_folder, tiny_cache)
    with pytest.raises(UserInputError, match="being trained by run 'a'.*one LoRA at a time"):
        Trainer(components, cached, LORA, OPTIM, TrainConfig(run_name="direct"))
    live.train(1)  # the refused trainer left the live one's adapter alone


def test_changed_lora_settings_name_the_difference_and_keep_the_live_run(tiny_run):
    open_, _ = tiny_run
    live = open_("a").trainer
    live.train(1)
    with pytest.raises(UserInputError, match="run 'a' is training \\(step 1\\) with other settings: rank: running 4, "
                                             "now 8.*new run_name"):
        open_("a", lora=LoraConfig(rank=8, alpha=4.0))
    assert runs.find("a") is live and live.live
    live.train(1)


def test_changed_learning_rate_rebuilds_and_resumes_exactly(tiny_run, tmp_path, demo_folder):
    open_, _ = tiny_run
    first = open_("a").trainer
    first.train(2)
    faster = OptimizerConfig(learning_rate=3e-3)
    rebuilt = open_("a", optimizer=faster)
    assert rebuilt.action == "resumed" and rebuilt.trainer is not first and rebuilt.trainer.step == 2
    with pytest.raises(UserInputError, match="rebuilt with new settings"):
        first.train(1)
    rebuilt.trainer.train(2)
    got = {n: p.detach().clone() for n, p in zip(rebuilt.trainer.built.param_names, rebuilt.trainer.built.params)}
    runs.release("a")

    # Reference: the same two chunks in one trainer whose learning rate changes in between.
    reference = open_("ref").trainer
    reference.train(2)
    reference.optim_cfg = faster
    reference.train(2)
    expected = dict(zip(reference.built.param_names, reference.built.params))
    assert all(torch.equal(got[k], expected[k]) for k in got)


def test_the_status_says_how_many_blocks_recompute(tiny_run):
    open_, _ = tiny_run
    run = open_("ckpt", gradient_checkpointing="auto", blocks_to_swap="auto")
    blocks = len(run.trainer.built.transformer.transformer_blocks)
    head = run.status.partition("\n\n")[0]  # what the canvas shows whole (nodes/train_nodes.canvas_status)
    assert f"blocks_to_swap: 0 (auto)\ncheckpointing: {blocks} of {blocks} blocks recompute (auto, no GPU budget known)" \
        in head
    assert "recompute" not in open_("plain", gradient_checkpointing=False).status.partition("\n\n")[0]


def test_auto_swapping_resolves_in_the_engine(tiny_run):
    open_, _ = tiny_run
    run = open_("a", blocks_to_swap="auto")
    assert run.trainer.train_cfg.blocks_to_swap == AUTO_SWAP  # the setting stays as asked
    assert run.trainer.decided.swap.blocks_to_swap == 0  # CPU: nothing to swap
    assert "blocks_to_swap: 0 (auto)" in run.status and "CPU training" in run.status
    assert TrainConfig(blocks_to_swap="AUTO").auto_swap and TrainConfig(blocks_to_swap=-1).auto_swap
    with pytest.raises(UserInputError, match="blocks_to_swap=-2 is outside its range"):
        TrainConfig(blocks_to_swap=-2).validate()
    with pytest.raises(UserInputError, match="blocks_to_swap='half' is not a number"):
        TrainConfig(blocks_to_swap="half")


# --------------------------------------------------------------------------------------------------
# the lock


def test_the_lock_refuses_a_second_trainer_on_a_run_folder(tiny_run, demo_folder, tiny_cache, tmp_path):
    open_, _ = tiny_run
    open_("a")
    other = build_tiny_components(seed=0, storage="float32")  # another model set: only the folder is shared
    cached = cached_demo(other, demo_folder, tiny_cache)
    with pytest.raises(UserInputError, match=f"run folder {tmp_path / 'a'} is in use by another trainer "
                                             f"\\(pid {os.getpid()} .*run 'a'\\)"):
        Trainer(other, cached, LORA, OPTIM, TrainConfig(run_name="a"), run_dir=tmp_path / "a")
    assert not any(".lora_" in n for n in other.transformer.state_dict())  # refused before touching the model
    runs.release("a")
    Trainer(other, cached, LORA, OPTIM, TrainConfig(run_name="a"), run_dir=tmp_path / "a").close()


HOLD_LOCK = """
import sys
sys.path.insert(0, sys.argv[1])
from trainer_core.core.run_lock import RunLock
lock = RunLock(sys.argv[2])
lock.acquire(owner="holder")
print("locked", flush=True)
sys.stdin.readline()
"""


def test_the_lock_of_another_process_refuses_and_a_dead_holders_lock_is_taken_over(tmp_path, demo_folder,
                                                                                   tiny_cache):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(REPO), str(run_dir)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        components = build_tiny_components(seed=0, storage="float32")
        cached = cached_demo(components, demo_folder, tiny_cache)
        with pytest.raises(UserInputError, match=f"in use by another trainer \\(pid {holder.pid} .*holder\\)"):
            Trainer(components, cached, LORA, OPTIM, TrainConfig(run_name="run"), run_dir=run_dir)
        holder.send_signal(signal.SIGKILL)  # killed: no clean-up ran, the lock file stays behind
        holder.wait()
        assert (run_dir / ".lock").exists()
        trainer = Trainer(components, cached, LORA, OPTIM, TrainConfig(run_name="run"), run_dir=run_dir)
        trainer.train(1)
        trainer.close()
    finally:
        holder.kill()
        holder.wait()


# --------------------------------------------------------------------------------------------------
# the nodes


@pytest.fixture
def output_dirs(pack, tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    yield tmp_path
    pack_module(pack, "trainer_core.runs.registry").release_all()


def lora_tensors(path):
    return load_file(str(path))


def test_two_init_trainers_on_one_model_set_never_mix_adapters(pack, tmp_path, demo_folder, output_dirs):
    """Both Init Trainer nodes run before either Train Steps (node "0" is visited first): the later run
    retires the earlier; the retired run's Train Steps raises the documented error, and the LoRA saved by
    the other run equals that run trained alone."""
    UserInputError = pack_module(pack, "trainer_core.core.errors").UserInputError
    prompt = tiny_prompt(tmp_path, demo_folder, steps=2)
    prompt["6"]["inputs"]["run_name"] = "run_a"
    prompt["0"] = json.loads(json.dumps(prompt["6"]))
    prompt["0"]["inputs"]["run_name"] = "run_b"
    prompt["17"] = {"class_type": "QwenLoRATrain", "inputs": {"trainer": ["0", 0], "steps": 2}}
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    with pytest.raises(UserInputError, match="run 'run_b' was retired at step 0: run 'run_a' started training the "
                                             "same loaded model"):
        runner.run(prompt)
    assert set(runner.executed) >= {"0", "6", "7", "10"}
    saved = lora_tensors(next((tmp_path / "loras").glob("run_a_*.safetensors")))

    alone = tiny_prompt(tmp_path / "alone", demo_folder, steps=2, **{"10": {"filename": "alone"}})
    alone["6"]["inputs"]["run_name"] = "run_alone"
    GraphRunner(pack.NODE_CLASS_MAPPINGS).run(alone)
    reference = lora_tensors(tmp_path / "loras" / "alone.safetensors")
    assert saved.keys() == reference.keys() and all(torch.equal(saved[k], reference[k]) for k in saved)
    # run_b's checkpoint holds its own LoRA tensors: it can be resumed later.
    tensors, meta, _ = pack_module(pack, "trainer_core.training.checkpoint").load_latest(
        tmp_path / "output" / "qwen_lora_training" / "runs" / "run_b")
    assert meta["step"] == 0 and sum(k.startswith("lora.") for k in tensors) == len(meta["param_names"])


def test_release_node_frees_the_run_and_the_next_queue_resumes_it(pack, tmp_path, demo_folder, output_dirs):
    prompt = tiny_prompt(tmp_path, demo_folder, steps=2)
    prompt["15"] = {"class_type": "QwenLoRARelease",
                    "inputs": {"trainer": ["7", 0], "saved_lora": ["10", 0], "preview": ["8", 0]}}
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    first = runner.run(prompt)
    name = prompt["6"]["inputs"]["run_name"]
    assert first["15"][0].startswith(f"released run '{name}' at step 2")
    assert pack_module(pack, "trainer_core.runs.registry").live_runs() == []
    again = runner.run(prompt)  # Init Trainer runs again (its IS_CHANGED moved) and resumes
    assert "6" in runner.executed and again["6"][1].startswith(f"resumed run '{name}' from its checkpoint at step 2")
    assert again["7"][0].step == 4


def test_a_run_on_a_new_model_set_releases_the_run_on_the_old_one(pack, tmp_path, demo_folder, output_dirs):
    """The Load node re-ran (other settings): its old model set must not keep a trainer, and memory, alive."""
    runs_ = pack_module(pack, "trainer_core.runs.registry")
    first = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(tiny_prompt(tmp_path / "a", demo_folder, steps=1))["7"][0]
    old_models = first.components
    second = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(tiny_prompt(tmp_path / "b", demo_folder, steps=1))["7"][0]
    assert second.components is not old_models
    assert runs_.live_runs() == [second.train_cfg.run_name]
    assert not first.live and f"run '{second.train_cfg.run_name}' started" in first.retired_reason
    assert not any(".lora_" in n for n in old_models.transformer.state_dict())


def test_a_retirement_whose_checkpoint_fails_keeps_the_run_live(tiny_run, monkeypatch):
    import errno

    open_, _ = tiny_run
    live = open_("a").trainer  # at step 0, not yet checkpointed (training checkpoints at every chunk's end)

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "save_file", disk_full)  # the library writer under checkpoint.py
    with pytest.raises(UserInputError, match="disk is full.*still holds step 0"):
        open_("b")
    assert runs.find("a") is live and live.live  # nothing lost, nothing half-retired
    monkeypatch.undo()
    live.train(1)
    assert open_("b").action == "started" and not live.live


RACE_FOR_LOCK = """
import sys, time
sys.path.insert(0, sys.argv[1])
from trainer_core.core.errors import UserInputError
from trainer_core.core.run_lock import RunLock
lock = RunLock(sys.argv[2])
while time.time() < float(sys.argv[3]):  # start together
    pass
try:
    lock.acquire(owner="racer")
    print("won", flush=True)
    time.sleep(2)
except UserInputError as e:
    print("refused", e, flush=True)
"""


def test_two_processes_racing_for_one_run_folder_never_both_get_it(tmp_path):
    import time

    start = time.time() + 1.0
    racers = [subprocess.Popen([sys.executable, "-c", RACE_FOR_LOCK, str(REPO), str(tmp_path / "run"), str(start)],
                               stdout=subprocess.PIPE, text=True) for _ in range(4)]
    results = sorted(p.communicate(timeout=60)[0].split()[0] for p in racers)
    assert results == ["refused", "refused", "refused", "won"]


def test_a_trainer_whose_lock_file_was_removed_stops_writing_checkpoints(tiny_run, tmp_path, demo_folder, tiny_cache):
    open_, _ = tiny_run
    first = open_("a").trainer
    first.train(1)
    (tmp_path / "a" / ".lock").unlink()  # a hostile or confused clean-up
    other = build_tiny_components(seed=0, storage="float32")
    second = Trainer(other, cached_demo(other, demo_folder, tiny_cache), LORA, OPTIM, TrainConfig(run_name="a"),
                     run_dir=tmp_path / "a")  # takes the folder with a new lock file
    with pytest.raises(UserInputError, match="lock of run folder .* was removed or replaced and another trainer holds it now.*step 2 was not written"):
        first.train(1)
    assert ckpt.load_latest(tmp_path / "a")[1]["step"] == 1  # nothing of the first trainer's step 2 on disk
    runs.release("a")  # the first run can still be let go (its step 2 is not written anywhere)
    assert ckpt.load_latest(tmp_path / "a")[1]["step"] == 1
    second.train(1)
    second.close()


def test_a_run_folder_deleted_mid_run_is_made_again_and_locked_again(tiny_run, tmp_path, demo_folder, tiny_cache):
    import shutil

    open_, _ = tiny_run
    first = open_("a").trainer
    first.train(1)
    shutil.rmtree(tmp_path / "a")  # nobody else took it: the next checkpoint recreates the folder and its lock
    first.train(1)
    assert ckpt.load_latest(tmp_path / "a")[1]["step"] == 2 and first.lock.still_held()
    other = build_tiny_components(seed=0, storage="float32")
    with pytest.raises(UserInputError, match="is in use by another trainer"):
        Trainer(other, cached_demo(other, demo_folder, tiny_cache), LORA, OPTIM, TrainConfig(run_name="a"),
                run_dir=tmp_path / "a")
