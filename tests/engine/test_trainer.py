"""The trainer: chunked == unchunked bit for bit, swapping and checkpointing change nothing, the loss falls."""

import pytest
import torch

from conftest import adapter_snapshot, cached_demo
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.training import Trainer


def make_trainer(cache_dir, folder, storage="float32", lora=None, optim=None, **train):
    """`cache_dir`: the session's shared cache (conftest.tiny_cache, content-addressed): the demo dataset is
    encoded once, not for every trainer (no test here is about the cache)."""
    components = build_tiny_components(seed=0, storage=storage)
    cached = cached_demo(components, folder, cache_dir, preview_prompts=["a red circle on a white background"])
    settings = dict(seed=3, micro_batch_size=2)
    settings.update(train)
    return Trainer(components, cached, lora or LoraConfig(rank=4, alpha=8.0, targets="all", dropout=0.1),
                   optim or OptimizerConfig(learning_rate=1e-3, warmup_steps=3, schedule="cosine", schedule_steps=20),
                   TrainConfig(**settings))


def assert_same_adapter(a, b):
    sa, sb = adapter_snapshot(a), adapter_snapshot(b)
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize("optimizer", ["adamw8bit", "adamw"])
def test_three_chunks_of_three_equal_one_chunk_of_nine(demo_folder, tiny_cache, optimizer):
    """4 samples a step (micro-batches of 2, accumulation 2): the chunks' ends (steps 3, 6) fall mid-epoch and
    epochs end mid-chunk; the warmup (3 steps) ends at the first chunk's end and the cosine runs over all 9."""
    optim = OptimizerConfig(optimizer=optimizer, learning_rate=1e-3, warmup_steps=3, schedule="cosine", schedule_steps=9)
    whole = make_trainer(tiny_cache, demo_folder, optim=optim, grad_accum_steps=2, caption_dropout=0.3)
    chunked = make_trainer(tiny_cache, demo_folder, optim=optim, grad_accum_steps=2, caption_dropout=0.3)
    report = whole.train(9)
    for _ in range(3):
        chunked.train(3)
    assert whole.step == chunked.step == 9
    assert_same_adapter(whole, chunked)
    assert [l for _, l in whole.progress.loss_history] == [l for _, l in chunked.progress.loss_history] == report.losses
    assert whole.built.optimizer.param_groups[0]["lr"] == chunked.built.optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize("blocks_to_swap", [1])  # the tiny model has 2 blocks: 1 is all-but-one
@pytest.mark.parametrize("checkpointing", [False, True])
def test_block_swapping_gives_identical_weights(demo_folder, tiny_cache, blocks_to_swap, checkpointing):
    plain = make_trainer(tiny_cache, demo_folder, storage="float8", gradient_checkpointing=checkpointing)
    swapped = make_trainer(tiny_cache, demo_folder, storage="float8", gradient_checkpointing=checkpointing,
                           blocks_to_swap=blocks_to_swap)
    plain.train(6)
    swapped.train(6)
    assert_same_adapter(plain, swapped)
    assert swapped.built.runner.swapper.bytes_copied > 0  # weights really travelled through the slots


@pytest.mark.parametrize("storage", ["float8", "float32"])
def test_block_swapping_on_a_deeper_model_all_but_one(demo_folder, tiny_cache, storage):
    """4 blocks: swapping 0, 1 and 3 (all but one) gives the same gradients and weights. float32 storage on the
    CPU computes resident Linears with plain F.linear (autograd keeps a reference to the weight); the swapper
    marks the streamed ones, which keep reading their weight again at backward (storage.mark_weight_moves)."""
    from trainer_core.models import tiny as tiny_models

    original = dict(tiny_models.TINY_TRANSFORMER)
    tiny_models.TINY_TRANSFORMER["num_layers"] = 4
    try:
        runs = [make_trainer(tiny_cache, demo_folder, storage=storage, blocks_to_swap=k) for k in (0, 1, 3)]
        grads = []
        for t in runs:
            t.train(3)
            loss = t.built.flow.loss(t.built.flow.draw(t.progress.micro_batches, indices=[0, 1]))
            loss.backward()
            grads.append({n: p.grad.clone() for n, p in t.built.transformer.named_parameters() if p.grad is not None})
            t.built.optimizer.zero_grad(set_to_none=True)
    finally:
        tiny_models.TINY_TRANSFORMER.update(original)
    for other, other_grads in zip(runs[1:], grads[1:]):
        assert_same_adapter(runs[0], other)
        assert grads[0].keys() == other_grads.keys()
        assert all(torch.equal(grads[0][n], other_grads[n]) for n in grads[0])


def test_checkpointing_gives_identical_weights(demo_folder, tiny_cache):
    a = make_trainer(tiny_cache, demo_folder, gradient_checkpointing=False)
    b = make_trainer(tiny_cache, demo_folder, gradient_checkpointing=True)
    a.train(5)
    b.train(5)
    assert_same_adapter(a, b)


def test_auto_checkpointing_on_the_cpu_trains_exactly_as_on(demo_folder, tiny_cache):
    """No GPU budget on the CPU: 'auto' recomputes every block, as 'on' (then True) did, bit for bit."""
    on = make_trainer(tiny_cache, demo_folder, gradient_checkpointing="on")
    auto = make_trainer(tiny_cache, demo_folder, gradient_checkpointing="auto")
    blocks = len(auto.built.transformer.transformer_blocks)
    assert auto.built.runner.checkpoint_depth == on.built.runner.checkpoint_depth == blocks
    assert auto.decided.swap.checkpointing_note == \
        f"checkpointing: {blocks} of {blocks} blocks recompute (auto, no GPU budget known)"
    assert on.decided.swap.checkpointing_note is None
    assert on.train(4).losses == auto.train(4).losses
    assert_same_adapter(on, auto)


def test_every_lora_tensor_learns(demo_folder, tiny_cache):
    """No target is dead: in particular the last block's text-stream modules are left out."""
    t = make_trainer(tiny_cache, demo_folder, lora=LoraConfig(rank=4, alpha=4.0, targets="all"),
                     optim=OptimizerConfig(learning_rate=1e-3, weight_decay=0.0))
    before = adapter_snapshot(t)
    t.train(3)
    after = adapter_snapshot(t)
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert unchanged == []
    assert not any("transformer_blocks.1.attn.add_q_proj" in n for n in before)


def test_loss_falls_on_the_demo_dataset(demo_folder, tiny_cache):
    t = make_trainer(tiny_cache, demo_folder, lora=LoraConfig(rank=8, alpha=8.0, targets="all"),
                     optim=OptimizerConfig(learning_rate=2e-3, warmup_steps=10))
    losses = t.train(60).losses  # measured: the last 10 average 0.66 x the first 10 (0.36 after 120 steps)
    assert sum(losses[-10:]) / 10 < 0.8 * sum(losses[:10]) / 10, losses


def test_adapter_starts_as_a_no_op(demo_folder, tiny_cache):
    from trainer_core.adapters.lora import adapter_weights

    t = make_trainer(tiny_cache, demo_folder)
    assert all(torch.count_nonzero(b) == 0 for _, b in adapter_weights(t.built.transformer).values())
    assert all(torch.count_nonzero(a) > 0 for a, _ in adapter_weights(t.built.transformer).values())


def test_close_returns_the_model_unchanged(demo_folder, tiny_cache):
    t = make_trainer(tiny_cache, demo_folder, storage="float8", blocks_to_swap=1, gradient_checkpointing=True)
    names_before = {n for n, _ in t.built.transformer.named_parameters() if ".lora_" not in n}
    t.train(2)
    t.close()  # it drops its built parts: the model is the model set's again
    names_after = {n.replace(".base_layer", "") for n, _ in t.components.transformer.named_parameters()}
    assert names_after == {n.replace(".base_layer", "") for n in names_before}
    assert all(p.numel() > 0 for p in t.components.transformer.parameters())  # swapped weights are back in place
    assert not hasattr(t.components.transformer, "peft_config")  # a new adapter can be injected without peft's warning


def test_learning_rate_schedule():
    from trainer_core.training.optim import lr_factor

    cfg = OptimizerConfig(warmup_steps=4, schedule="cosine", schedule_steps=14, min_lr_ratio=0.1)
    factors = [lr_factor(s, cfg) for s in range(16)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert factors[4] == 1.0 and abs(factors[9] - 0.55) < 1e-9 and factors[14] == factors[15] == pytest.approx(0.1)
    assert lr_factor(100, OptimizerConfig(warmup_steps=0)) == 1.0


def test_the_trainers_shape_is_declared_in_one_place(demo_folder, tiny_cache, tmp_path):
    """Every attribute a trainer has is declared where its shape is (training/base.py): building, training,
    checkpointing, resuming, previews, saving and retiring add none. The settings stay the objects asked for; what
    the engine decided from them (the swap count of 'auto') is beside them."""
    from trainer_core.training.base import TrainerBase
    from trainer_core.training.live import PreviewSettings

    prompt = "a red circle on a white background"
    components = build_tiny_components(seed=0, storage="float32")
    cached = cached_demo(components, demo_folder, tiny_cache, preview_prompts=[prompt])
    lora, optim, train = LoraConfig(rank=4, alpha=8.0), OptimizerConfig(), TrainConfig(seed=3, checkpoint_every=1)
    t = Trainer(components, cached, lora, optim, train, run_dir=tmp_path / "run")
    declared = set(vars(TrainerBase(components, cached, lora, optim, train, None, t.replicas, t.comparison)))
    assert set(vars(t)) == declared
    t.train(2)
    t.preview_step(PreviewSettings(prompt, size=64, steps=2))
    t.save_lora(tmp_path / "lora.safetensors")
    assert t.resume() and t.step == 2
    t.retire("done")
    assert set(vars(t)) == declared
    assert (t.lora_cfg, t.optim_cfg, t.train_cfg) == (lora, optim, train) and t.train_cfg is train
    assert train.auto_swap and t.decided.swap.auto and t.decided.swap.blocks_to_swap == 0  # CPU: nothing to swap
