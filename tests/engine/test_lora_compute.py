"""The LoRA computes in the activations' dtype (`lora.compute_in_input_dtype`) while its weights, gradients and
updates stay fp32: same loss as peft's fp32 compute to bf16 precision, and updates too small for bf16 kept."""

import torch

from conftest import cached_demo
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.adapters.lora import compute_in_input_dtype
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.training import Trainer


def bf16_trainer(tmp_path, demo_folder, lr):
    """Trainers of one test share TMP/cache: the demo dataset is encoded once per test, not per trainer."""
    components = build_tiny_components(seed=0, storage="float8", compute_dtype=torch.bfloat16)
    cached = cached_demo(components, demo_folder, tmp_path / "cache")
    return Trainer(components, cached, LoraConfig(rank=4, alpha=4.0, dtype="float32"),
                   OptimizerConfig(optimizer="adamw", learning_rate=lr, weight_decay=0.0, warmup_steps=0),
                   TrainConfig(seed=1, blocks_to_swap=1))


def test_same_loss_as_fp32_compute_on_the_same_batch(tmp_path, demo_folder):
    t = bf16_trainer(tmp_path, demo_folder, lr=1e-3)
    t.train(2)  # B is no longer zero: the LoRA changes the output
    losses = {}
    for enabled in (True, False):
        compute_in_input_dtype(t.built.transformer, enabled=enabled)
        with torch.no_grad():  # the same draws both times: they are a function of the micro-batch's number
            losses[enabled] = float(t.built.flow.loss(t.built.flow.draw(t.progress.micro_batches, indices=[0])))
    assert abs(losses[True] - losses[False]) <= 1e-2 * abs(losses[False])
    t.close()


def test_updates_too_small_for_bf16_are_kept_and_chunks_stay_bit_identical(tmp_path, demo_folder):
    """bf16 compute (the LoRA in bf16, fp32 masters), float8 blocks, a streamed block, checkpointing (modulation
    outputs kept, the last block's text stream detached): 2 + 2 steps equal 4 steps, bit for bit; and updates of
    ~lr = 1e-5 per step, far below bf16's resolution at values ~0.1 (2^-11), are kept by the fp32 masters."""
    whole = bf16_trainer(tmp_path, demo_folder, 1e-5)
    before = [p.detach().clone() for p in whole.built.params]
    whole.train(4)
    after = [p.detach().clone() for p in whole.built.params]
    whole.close()
    assert all(p.dtype == torch.float32 for p in after)
    assert all((a != b).any() for a, b in zip(after, before))  # every tensor learnt
    assert ((after[0] != before[0]) & (after[0].bfloat16() == before[0].bfloat16())).any()
    chunked = bf16_trainer(tmp_path, demo_folder, 1e-5)
    chunked.train(2)
    chunked.train(2)
    assert all(torch.equal(a, b) for a, b in zip(after, chunked.built.params))
    chunked.close()
