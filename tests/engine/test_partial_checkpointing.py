"""Checkpointing only as deep as memory needs (`BlockRunner(checkpointed_blocks=K)`: blocks 0..K-1 recompute in
backward, the others keep their activations): the same loss and LoRA gradients as every block recomputing and as
none, bit for bit on the CPU, and the saved bytes between the two."""

import pytest
import torch

from trainer_core.adapters.lora import compute_in_input_dtype, inject_lora, lora_parameters
from trainer_core.core.config import LoraConfig
from trainer_core.devtools.random_weights import random_transformer
from trainer_core.streaming.runner import BlockRunner
from trainer_core.training.objective import flow_loss

CPU = torch.device("cpu")
CONFIG = dict(num_layers=3, num_attention_heads=1, joint_attention_dim=24, in_channels=16,
              out_channels=4)


def _step(**runner):
    """(loss, LoRA gradients, bytes saved for backward) of one forward + backward, same weights and inputs."""
    model = random_transformer(CONFIG, storage="float32", compute_dtype=torch.float32, seed=0)
    inject_lora(model, LoraConfig(rank=2, alpha=2.0, targets="attention+mlp"), seed=0)
    compute_in_input_dtype(model)
    params = lora_parameters(model)
    init = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in params:  # B starts at zero: give the LoRA a nonzero contribution so its A gradients are not zero
            p.copy_(torch.randn(p.shape, generator=init) * 0.1)
    run = BlockRunner(model, CPU, **runner)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 16, 16, generator=g)  # (B, 4 x 4 packed tokens, in_channels)
    text = torch.randn(1, 5, 24, generator=g)  # (B, text tokens, joint dim)
    target = torch.randn(1, 16, 16, generator=g)
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(hidden_states=x, encoder_hidden_states=text, timestep=torch.tensor([0.5]),
                        img_shapes=[[(1, 4, 4)]], return_dict=False)[0]
            loss = flow_loss(out, target)
        loss.backward()
    finally:
        run.uninstall()
    return loss.detach(), [p.grad.clone() for p in params], sum(saved)


def test_partial_checkpointing_trains_the_same_as_full_and_none():
    full_loss, full_grads, full_saved = _step(checkpointing=True)
    none_loss, none_grads, none_saved = _step(checkpointing=False)
    for k in (0, 1, 2, 3):
        loss, grads, saved = _step(checkpointing=True, checkpointed_blocks=k)
        assert torch.equal(loss, full_loss) and torch.equal(loss, none_loss), k
        assert all(torch.equal(a, b) for a, b in zip(grads, full_grads)), k
        assert all(torch.equal(a, b) for a, b in zip(grads, none_grads)), k
        assert full_saved <= saved <= none_saved, (k, full_saved, saved, none_saved)
        if k == 3:
            assert saved == full_saved
        if k == 0:
            assert saved == none_saved
    assert full_saved < _step(checkpointing=True, checkpointed_blocks=2)[2] < _step(
        checkpointing=True, checkpointed_blocks=1)[2] < none_saved


def test_partial_checkpointing_is_refused_with_streamed_blocks_or_out_of_range():
    model = random_transformer(CONFIG, storage="float32", compute_dtype=torch.float32, seed=0)
    with pytest.raises(ValueError, match="between 0 and 3"):
        BlockRunner(model, CPU, checkpointing=True, checkpointed_blocks=4)
    with pytest.raises(ValueError, match="every block resident"):
        BlockRunner(model, CPU, blocks_to_swap=1, checkpointing=True, checkpointed_blocks=1)
