"""EMA of the adapter's weights (training/ema.py): what it averages, that it resumes bit-exactly, what Save writes
and what Preview samples. The tiny model with block streaming (blocks_to_swap=1) on float8 storage, rank 4."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch.optim.swa_utils import get_ema_avg_fn

from conftest import cached_demo
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.training import Trainer
from trainer_core.training.ema import ema_decay_at, ema_path
from trainer_core.training.outputs import lora_state_dict

PROMPT = "a red circle on a white background"


@pytest.fixture(scope="module")
def cached(demo_folder, tiny_cache):
    components = build_tiny_components(seed=0, storage="float8")
    return components, cached_demo(components, demo_folder, tiny_cache)


def make(cached, run_dir=None, ema=True, decay=0.9, lora_dtype="float32"):
    components, dataset = cached
    return Trainer(components, dataset, LoraConfig(rank=4, alpha=4.0, dtype=lora_dtype),
                   OptimizerConfig(learning_rate=5e-3, ema=ema, ema_decay=decay),
                   TrainConfig(seed=3, blocks_to_swap=1, checkpoint_every=0), run_dir=run_dir)


def raw(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.built.params]


def test_ema_with_decay_0_is_the_raw_weights_exactly(cached):
    trainer = make(cached, decay=0.0)
    try:
        trainer.train(3)
        assert trainer.built.ema.updates == 3
        for p, a in zip(trainer.built.params, trainer.built.ema.averages):
            assert torch.equal(p.detach(), a)
    finally:
        trainer.close()


def test_ema_after_n_steps_is_the_ema_of_the_weights_history(cached):
    """Against torch's own EMA formula (swa_utils.get_ema_avg_fn, decay * average + (1 - decay) * weights), in
    float64, fed the weights after each step, with the warm-up decay min(decay, (1 + n) / (10 + n))."""
    trainer = make(cached, decay=0.9)
    try:
        history = [raw(trainer)]
        trainer.train(5, on_step=lambda step: history.append(raw(trainer)))
        expected = [w.double() for w in history[0]]
        for n, weights in enumerate(history[1:]):
            step = get_ema_avg_fn(ema_decay_at(0.9, n))
            expected = [step(e, w.double(), n) for e, w in zip(expected, weights)]
        assert [ema_decay_at(0.9, n) for n in (0, 1, 5, 10)] == [0.1, 2 / 11, 0.4, 0.55]  # warm-up, then 0.9
        for e, a, w in zip(expected, trainer.built.ema.averages, history[-1]):
            torch.testing.assert_close(a.double(), e, rtol=1e-6, atol=1e-9)
        assert any(not torch.equal(a, w) for a, w in zip(trainer.built.ema.averages, history[-1]))  # it does average
    finally:
        trainer.close()


def test_resume_with_ema_is_bit_exact_and_a_checkpoint_without_ema_still_loads(cached, tmp_path):
    whole = make(cached, tmp_path / "whole")
    whole.train(4)
    whole_raw, whole_ema = raw(whole), [a.clone() for a in whole.built.ema.averages]
    whole.close()

    first = make(cached, tmp_path / "split")
    first.train(2)
    first.close()
    again = make(cached, tmp_path / "split")
    assert again.resume() and again.built.ema.updates == 2
    again.train(2)
    try:
        for a, b in zip(raw(again), whole_raw):
            assert torch.equal(a, b)
        for a, b in zip(again.built.ema.averages, whole_ema):
            assert torch.equal(a, b)
    finally:
        again.close()

    plain = make(cached, tmp_path / "plain", ema=False)
    plain.train(2)
    plain.close()
    notes: list[str] = []
    turned_on = make(cached, tmp_path / "plain")
    try:
        assert turned_on.resume(notes) and turned_on.step == 2
        assert turned_on.built.ema.updates == 0 and "without EMA" in " ".join(notes)
        built = turned_on.built
        for p, a in zip(built.params, built.ema.averages):  # the average starts at the resumed weights
            assert torch.equal(p.detach(), a)
    finally:
        turned_on.close()


def test_save_writes_the_ema_file_beside_the_raw_one_with_the_same_keys(cached, tmp_path):
    trainer = make(cached, decay=0.9)
    try:
        trainer.train(3)
        before = raw(trainer)
        path = trainer.save_lora(tmp_path / "run_000003.safetensors", dtype=torch.float32)
        assert ema_path(path).name == "run_000003_ema.safetensors"
        raw_file, ema_file = load_file(str(path)), load_file(str(ema_path(path)))
        assert raw_file.keys() == ema_file.keys()
        ema_tensors = lora_state_dict(trainer.built, trainer.decided.lora, trainer.train_cfg.run_name, torch.float32,
                                      weights="ema")
        assert raw_file.keys() == ema_tensors.keys()
        for key, value in ema_tensors.items():
            assert torch.equal(ema_file[key], value), key
        assert any(not torch.equal(raw_file[k], ema_file[k]) for k in raw_file)
        with safe_open(str(ema_path(path)), "pt") as f:
            assert f.metadata()["qwen_lora.weights"] == "ema" and f.metadata()["qwen_lora.ema_updates"] == "3"
        for p, b in zip(trainer.built.params, before):  # the raw weights are back, bit for bit
            assert torch.equal(p.detach(), b)
    finally:
        trainer.close()


def test_preview_with_ema_samples_the_ema_weights_and_puts_the_raw_ones_back(cached):
    """A bfloat16 LoRA: the float32 average is cast into it to sample, the raw bf16 weights come back exactly.
    What the transformer computes with is read at each of its forwards while sampling."""
    trainer = make(cached, decay=0.5, lora_dtype="bfloat16")
    seen: list[list[torch.Tensor]] = []
    hook = trainer.built.transformer.register_forward_pre_hook(lambda module, args: seen.append(raw(trainer)))
    try:
        trainer.train(3)
        before = raw(trainer)
        seen.clear()
        trainer.sample_preview(PROMPT, width=32, height=32, steps=2, weights="ema")
        cast = [a.to(torch.bfloat16) for a in trainer.built.ema.averages]
        assert seen and any(not torch.equal(c, b) for c, b in zip(cast, before))
        for weights in seen:  # every forward of the sampling (CFG: two)
            assert all(torch.equal(w, c) for w, c in zip(weights, cast))
        for p, b in zip(trainer.built.params, before):
            assert torch.equal(p.detach(), b)
        seen.clear()
        trainer.sample_preview(PROMPT, width=32, height=32, steps=2)  # raw: the weights as trained
        for weights in seen:
            assert all(torch.equal(w, b) for w, b in zip(weights, before))
    finally:
        hook.remove()
        trainer.close()


def test_ema_is_refused_where_it_cannot_be(cached):
    trainer = make(cached, ema=False)
    try:
        with pytest.raises(UserInputError, match="turn on ema"):
            trainer.sample_preview(PROMPT, width=32, height=32, steps=2, weights="ema")
    finally:
        trainer.close()
    with pytest.raises(UserInputError, match="schedule-free"):
        OptimizerConfig(optimizer="schedulefree_adamw", ema=True)
    with pytest.raises(UserInputError, match="ema_decay"):
        OptimizerConfig(ema=True, ema_decay=1.0)


def test_the_memory_plan_counts_the_average_as_allocated(cached):
    from trainer_core.planner import PlanInputs, arch_from_transformer, plan_memory

    trainer = make(cached, lora_dtype="bfloat16")
    try:
        arch = arch_from_transformer(trainer.built.transformer)
        inputs = PlanInputs(rank=4, lora_dtype="bfloat16", device="cpu", ema=True)
        with_ema, without = plan_memory(inputs, arch), plan_memory(PlanInputs(rank=4, device="cpu"), arch)
        allocated = sum(a.numel() * a.element_size() for a in trainer.built.ema.averages)  # float32 for a bf16 LoRA
        assert with_ema.term("EMA of the LoRA weights") == allocated and without.term("EMA of the LoRA weights") == 0
    finally:
        trainer.close()
