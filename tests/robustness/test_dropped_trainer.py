"""A trainer (or a block runner) dropped without close() leaves the next one on the same model set unharmed
(issue 25): the next trainer builds, trains, and ends with the LoRA a trainer on a fresh model set gets, bit
for bit; the next runner computes what a runner on a fresh model computes, on every float8 compute path.
A dropped trainer goes at once, with its claim on the model set and its run folder's lock, even where Python's
cyclic garbage collector has not run (issue 45): the trainer makes no reference cycle, and one the caller makes
is collected before a claim or a lock is refused.

What went wrong before: the dropped trainer's block runner stays installed (its block wrappers keep it alive),
and the next trainer's clean-up looked for it by digging through nested `functools.partial` layers that
partial() itself flattens: AttributeError: 'function' object has no attribute 'func'.
"""

import gc
import weakref

import pytest
import torch

from conftest import cached_demo
from trainer_core.core.run_lock import RunLock
from test_float8_activations import tiny_forward
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.models.float8.storage import frozen_block_linears
from trainer_core.streaming.runner import BlockRunner
from trainer_core.training import Trainer

CPU = torch.device("cpu")


def trainer_on(components, cached, **train) -> Trainer:
    return Trainer(components, cached, LoraConfig(rank=4, alpha=8.0, targets="all"),
                   OptimizerConfig(optimizer="adamw", learning_rate=1e-3, warmup_steps=0), TrainConfig(seed=3, **train))


@pytest.mark.parametrize("storage, compute, train", [
    ("float32", torch.float32, dict(gradient_checkpointing=False, blocks_to_swap=0)),
    ("float32", torch.float32, dict(gradient_checkpointing=True, blocks_to_swap=1)),
    ("float8", torch.float32, dict(gradient_checkpointing=False, blocks_to_swap=1)),
    ("float8", torch.bfloat16, dict(gradient_checkpointing=True, blocks_to_swap=1, fp8_activations=True)),
], ids=["plain", "checkpointed-streamed", "float8-streamed", "fp8-activations-checkpointed-streamed"])
def test_the_trainer_after_a_dropped_one_trains_as_on_a_fresh_model_set(demo_folder, tmp_path, storage, compute,
                                                                        train):
    components = build_tiny_components(seed=0, storage=storage, compute_dtype=compute)
    cached = cached_demo(components, demo_folder, tmp_path)
    dropped = trainer_on(components, cached, **train)
    dropped.train(1)  # mid-run: blocks in the ring, modulation cached or planned, LoRA changed
    del dropped
    gc.collect()
    after_drop = trainer_on(components, cached, **train)
    losses = after_drop.train(2).losses
    lora = [p.detach().clone() for p in after_drop.built.params]
    after_drop.close()

    fresh_components = build_tiny_components(seed=0, storage=storage, compute_dtype=compute)
    fresh = trainer_on(fresh_components, cached_demo(fresh_components, demo_folder, tmp_path), **train)
    assert fresh.train(2).losses == losses
    assert all(torch.equal(a, b) for a, b in zip(lora, fresh.built.params))
    fresh.close()


@pytest.mark.parametrize("path", [dict(), dict(fp8_activations=True), dict(compile_float8=True, compile_on_cpu=True)],
                         ids=["eager", "fp8-activations", "compiled"])
@pytest.mark.parametrize("checkpointing, blocks_to_swap", [(False, 0), (True, 1)])
def test_a_runner_after_a_dropped_one_computes_as_on_a_fresh_model(path, checkpointing, blocks_to_swap):
    """No trainer here: a new BlockRunner itself takes out one left installed (a runner per model). The compiled
    path is installed but never run (no compiling): what matters is that its forwards are gone."""
    model = build_tiny_components(seed=0, storage="float8_scaled", compute_dtype=torch.bfloat16).transformer
    eager_forwards = {lin: lin.__dict__["forward"] for _, lin in frozen_block_linears(model)}
    eager = tiny_forward(model)
    BlockRunner(model, CPU, checkpointing=checkpointing, blocks_to_swap=blocks_to_swap, **path)  # dropped at once
    gc.collect()
    runner = BlockRunner(model, CPU, checkpointing=checkpointing, blocks_to_swap=blocks_to_swap)
    assert torch.equal(tiny_forward(model), eager)
    runner.uninstall()
    assert {lin: lin.__dict__["forward"] for _, lin in frozen_block_linears(model)} == eager_forwards
    assert all(p.numel() for p in model.parameters())  # every streamed weight back on its master
    assert torch.equal(tiny_forward(model), eager)


def test_a_dropped_trainer_lets_go_of_its_model_set_and_run_folder_without_a_garbage_collection(demo_folder,
                                                                                                tiny_cache, tmp_path):
    """The cyclic collector is off throughout (a host may not have run it since): a trainer dropped mid-run (blocks
    streamed, checkpointed) is gone at `del`, and the next trainer on its model set and run folder resumes its
    checkpoint; one kept only by a cycle of the caller's is collected when the next trainer claims the model set."""
    components = build_tiny_components(seed=0, storage="float32")
    cached = cached_demo(components, demo_folder, tiny_cache)
    run = dict(run_dir=tmp_path / "run")
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        dropped = Trainer(components, cached, LoraConfig(rank=4, alpha=8.0), OptimizerConfig(optimizer="adamw"),
                          TrainConfig(run_name="dropped", blocks_to_swap=1), **run)
        dropped.train(1)
        gone = weakref.ref(dropped)
        del dropped
        assert gone() is None  # no cycle of its own keeps it
        kept = Trainer(components, cached, LoraConfig(rank=4, alpha=8.0), OptimizerConfig(optimizer="adamw"),
                       TrainConfig(run_name="dropped", blocks_to_swap=1), **run)
        assert kept.resume() and kept.step == 1
        cycle = [kept]
        cycle.append(cycle)  # the caller's own cycle: only the collector frees it
        gone = weakref.ref(kept)
        del kept, cycle
        assert gone() is not None
        after = Trainer(components, cached, LoraConfig(rank=4, alpha=8.0), OptimizerConfig(optimizer="adamw"),
                        TrainConfig(run_name="dropped", blocks_to_swap=1), **run)
        assert gone() is None and after.resume() and after.step == 1
        after.close()
        lock = RunLock(tmp_path / "locked")  # a lock alone, in a cycle: the next one on its folder is not refused
        lock.acquire("first")
        lock.cycle = lock
        del lock
        RunLock(tmp_path / "locked").acquire("second")
    finally:
        if was_enabled:
            gc.enable()
