"""A LoRA's initial weights come from one CPU generator, whatever device each block's weights are on."""

import torch

from trainer_core.core.config import LoraConfig
from trainer_core.devtools.random_weights import random_transformer
from trainer_core.adapters.lora import adapter_weights, inject_lora
from trainer_core.models.streaming import empty_transformer

CONFIG = dict(num_layers=3, num_attention_heads=2, attention_head_dim=16, axes_dims_rope=(8, 4, 4), joint_attention_dim=32)


def test_the_same_seed_gives_the_same_adapter_on_any_device():
    """A model whose weights are real on the CPU and one whose weights are not loaded at all (meta, as
    before streaming; the adapter asked for on the CPU) get the same A matrices, bit for bit; B is zero. The
    global CPU generator is left as it was."""
    cfg = LoraConfig(rank=4, alpha=4.0, targets="all")
    state = torch.get_rng_state()
    real = adapter_weights(_injected(random_transformer(CONFIG, storage="float8"), cfg))
    meta = empty_transformer(CONFIG)
    assert next(meta.transformer_blocks[0].parameters()).device.type == "meta"
    unloaded = adapter_weights(_injected(meta, cfg, device="cpu"))
    assert torch.equal(torch.get_rng_state(), state)
    assert list(real) == list(unloaded) and len(real) > 0
    for name, (a, b) in real.items():
        assert torch.equal(a, unloaded[name][0]) and a.abs().sum() > 0, name
        assert not b.any() and not unloaded[name][1].any()
    other = adapter_weights(_injected(random_transformer(CONFIG, storage="float8"), cfg, seed=1))
    assert not torch.equal(next(iter(other.values()))[0], next(iter(real.values()))[0])


def _injected(model, cfg, seed=0, device=None):
    inject_lora(model, cfg, seed=seed, device=device)
    return model
