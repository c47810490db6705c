"""Resume: k steps, checkpoint, a new process resumes, m more steps == k + m steps in one go, bit for bit."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import resume_worker
from conftest import REPO, adapter_snapshot, cached_demo
from trainer_core.training import checkpoint as ckpt
from trainer_core.core import files
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.training import Trainer

WORKER = Path(__file__).with_name("resume_worker.py")


def assert_same_tensors(a: Path, b: Path):
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


@pytest.mark.slow
def test_resume_in_a_new_process_is_bit_exact(demo_folder, tmp_path):
    """k steps and a checkpoint, then a new process resumes and trains to k + m: the LoRA equals k + m steps
    in one go, bit for bit. Twice: a Trainer with every stateful feature (resume_worker.py: float8, swapping,
    dropout, accumulation, AdamW8bit, a schedule), and `python -m trainer_core demo --resume`. One new
    process does both resumes (a process costs its imports, 5-25 s); the other runs are in this process."""
    from trainer_core.runs.cli import main

    resume_worker.main(demo_folder, tmp_path / "split", 3, False, tmp_path / "first.safetensors")
    resume_worker.main(demo_folder, tmp_path / "whole", 5, False, tmp_path / "whole.safetensors",
                       cache=tmp_path / "split" / "cache")  # the split run's cache (the same entries): encoded once
    assert main(["demo", "--model", "qwen-image", "--steps", "2", "--out", str(tmp_path / "D")]) == 0
    assert main(["demo", "--model", "qwen-image", "--steps", "4", "--out", str(tmp_path / "E")]) == 0
    args = [demo_folder, tmp_path / "split", 5, "resume", tmp_path / "split.safetensors",
            "--", "demo", "--model", "qwen-image", "--steps", 4, "--out", tmp_path / "D", "--resume"]
    result = subprocess.run([sys.executable, str(WORKER), *map(str, args)], capture_output=True, text=True,
                            timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    # A new process that trains with 8-bit AdamW: bitsandbytes' first import there logs no 4-bit kernel message
    # (core/quiet.py; test_silent_cases.py checks that its other messages still show).
    assert "gemm_4bit_forward" not in result.stderr
    assert "step 5" in result.stdout and "resumed from step 2" in result.stdout
    assert_same_tensors(tmp_path / "split.safetensors", tmp_path / "whole.safetensors")
    assert_same_tensors(tmp_path / "D" / "demo_lora.safetensors", tmp_path / "E" / "demo_lora.safetensors")


def make(tmp_path, demo_folder, cache, lora=None, optimizer="adamw8bit", run="run", **train):
    """A trainer on the seed-0 tiny model; `cache` is the session's shared cache folder (conftest.tiny_cache:
    content-addressed entries), since no test below is about the cache and encoding was much of their time."""
    components = build_tiny_components(seed=0, storage="float32")
    cached = cached_demo(components, demo_folder, cache)
    return Trainer(components, cached, lora or LoraConfig(rank=4, alpha=4.0),
                   OptimizerConfig(optimizer=optimizer, learning_rate=1e-3),
                   TrainConfig(seed=1, **train), run_dir=tmp_path / run)


def test_checkpoints_every_n_steps_and_at_the_end_keeping_two(demo_folder, tiny_cache, tmp_path):
    t = make(tmp_path, demo_folder, tiny_cache, checkpoint_every=2)
    t.train(5)
    root = ckpt.checkpoints_dir(tmp_path / "run")
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000004", "step_000005"]
    assert json.loads((root / "latest.json").read_text()) == {"dir": "step_000005", "step": 5}


def test_8bit_adamw_state_whose_quantisation_maps_are_shared_checkpoints_and_resumes_exactly(demo_folder, tiny_cache,
                                                                                              tmp_path):
    """bitsandbytes gives every parameter of 4096 elements or more (every LoRA tensor of the real model; rank 64
    here) the same two quantisation-map tensors, which safetensors refuses to write twice."""
    big = LoraConfig(rank=64, alpha=64.0)
    whole = make(tmp_path / "whole", demo_folder, tiny_cache, lora=big)
    whole.train(4)
    assert any(p.numel() >= 4096 for p in whole.built.params)
    split = make(tmp_path / "split", demo_folder, tiny_cache, lora=big)
    split.train(2)
    split.close()  # one trainer per run folder
    again = make(tmp_path / "split", demo_folder, tiny_cache, lora=big)
    assert again.resume() and again.step == 2
    again.train(2)
    assert all(torch.equal(a, b) for a, b in zip(whole.built.params, again.built.params))


def test_resuming_with_another_rank_or_optimizer_names_the_difference(demo_folder, tiny_cache, tmp_path):
    first = make(tmp_path, demo_folder, tiny_cache)
    first.train(2)
    first.close()  # one trainer per run folder
    with pytest.raises(UserInputError, match=r"rank: checkpoint 4, now 8.*use a\s+new run_name"):
        make(tmp_path, demo_folder, tiny_cache, lora=LoraConfig(rank=8, alpha=4.0)).resume()
    with pytest.raises(UserInputError, match="optimizer: checkpoint 'adamw8bit', now 'adamw'"):
        make(tmp_path, demo_folder, tiny_cache, optimizer="adamw").resume()


def test_resume_uses_the_newest_complete_checkpoint(demo_folder, tiny_cache, tmp_path):
    t = make(tmp_path, demo_folder, tiny_cache, checkpoint_every=1)
    t.train(3)
    root = ckpt.checkpoints_dir(tmp_path / "run")
    (root / "step_000003" / "state.safetensors").write_bytes(b"cut short")  # as if the disk filled up
    (root / "latest.json").unlink()
    t.close()  # one trainer per run folder
    again = make(tmp_path, demo_folder, tiny_cache)
    assert again.resume() and again.step == 2


def test_full_disk_while_checkpointing_keeps_the_previous_checkpoint(demo_folder, tiny_cache, tmp_path, monkeypatch):
    import errno

    t = make(tmp_path, demo_folder, tiny_cache)
    t.train(2)
    root = ckpt.checkpoints_dir(tmp_path / "run")
    before = (root / "step_000002" / "state.safetensors").read_bytes()

    def disk_full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "save_file", disk_full)  # the library writer under checkpoint.py
    with pytest.raises(UserInputError, match="disk is full.*still holds step 3"):
        t.train(1)
    assert t.step == 3  # nothing trained is lost: the step is in memory
    assert (root / "step_000002" / "state.safetensors").read_bytes() == before
    assert json.loads((root / "latest.json").read_text())["step"] == 2
    assert sorted(p.name for p in root.iterdir()) == ["latest.json", "step_000002"]
    monkeypatch.undo()
    t.train(1)  # space is back: training continues and checkpoints again
    assert json.loads((root / "latest.json").read_text())["step"] == 4


def test_nonfinite_loss_skips_the_step_and_several_stop_training(demo_folder, tiny_cache, tmp_path):
    from trainer_core.core.errors import TrainingStopped

    t = make(tmp_path, demo_folder, tiny_cache, max_nonfinite_steps=2)
    t.train(2)
    # Poison one cached latent in memory: the micro-batch that holds it gives a NaN loss.
    key = t.dataset.samples[0].latent_key
    good = t.dataset.latents(key).clone()
    t.dataset._memory[(key, "latents")] = torch.full_like(good, float("nan"))
    report = t.train(6)
    assert report.skipped >= 1 and t.step == 8
    assert all(torch.isfinite(p).all() for p in t.built.params)
    # Every latent poisoned: two bad steps in a row stop training with a message; the LoRA is kept.
    for s in t.dataset.samples:
        t.dataset._memory[(s.latent_key, "latents")] = torch.full_like(t.dataset.latents(s.latent_key), float("inf"))
    before = adapter_snapshot(t)
    with pytest.raises(TrainingStopped, match="2 steps in a row had a NaN/inf loss"):
        t.train(5)
    assert t.step == 8
    after = adapter_snapshot(t)
    assert all(torch.equal(before[k], after[k]) for k in before)
