"""The LoRA computes in the activations' dtype (`lora.compute_in_input_dtype`) while its weights, gradients and
updates stay fp32: same loss as peft's fp32 compute to bf16 precision, and updates too small for bf16 kept."""

import torch

from conftest import cached_demo
from trainer_core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.lora import compute_in_input_dtype
from trainer_core.models import build_tiny_components
from trainer_core.trainer import Trainer


def bf16_trainer(tmp_path, demo_folder, lr):
    components = build_tiny_components(seed=0, storage="float8", compute_dtype=torch.bfloat16)
    cached = cached_demo(components, demo_folder, tmp_path / "cache")
    return Trainer(components, cached, LoraConfig(rank=4, alpha=4.0, dtype="float32"),
                   OptimizerConfig(optimizer="adamw", learning_rate=lr, weight_decay=0.0, warmup_steps=0),
                   TrainConfig(seed=1, blocks_to_swap=1))


def test_bf16_compute_keeps_updates_too_small_for_bf16(tmp_path, demo_folder):
    t = bf16_trainer(tmp_path, demo_folder, lr=1e-5)
    before = [p.detach().clone() for p in t.params]
    t.train(2)
    assert all(p.dtype == torch.float32 for p in t.params)
    assert all((a != b).any() for a, b in zip(t.params, before))  # every tensor learnt
    # Adam moves each value by ~lr per step, far below bf16's resolution at values ~0.1 (2^-11): a bf16 master
    # would have dropped these updates, the fp32 master keeps them.
    a = t.params[0].detach()
    assert ((a != before[0]) & (a.bfloat16() == before[0].bfloat16())).any()
    t.close()


def test_same_loss_as_fp32_compute_on_the_same_batch(tmp_path, demo_folder):
    t = bf16_trainer(tmp_path, demo_folder, lr=1e-3)
    t.train(2)  # B is no longer zero: the LoRA changes the output
    state = t.rng.get_state()
    losses = {}
    for enabled in (True, False):
        compute_in_input_dtype(t.transformer, enabled=enabled)
        t.rng.set_state(state)
        with torch.no_grad():
            losses[enabled] = float(t._micro_batch_loss([0]))
    assert abs(losses[True] - losses[False]) <= 1e-2 * abs(losses[False])
    t.close()
