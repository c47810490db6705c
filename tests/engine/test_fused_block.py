"""Our fused Qwen-Image block (models.fused_block) against diffusers' own block, the oracle: the same outputs, loss
and LoRA gradients (peft's LoRA on the block's Linears), eager and compiled, fp32 and bf16, tiny and real width;
the mask dropped only where no token is padding; one compiled graph per shape for every block."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.transformers.transformer_qwenimage import QwenEmbedRope, QwenImageTransformerBlock
from peft import LoraConfig, inject_adapter_in_model

from trainer_core.models import fused_block
from trainer_core.models.attention_backend import AttentionChoice

SDPA = AttentionChoice("sdpa", "PyTorch's pick")
LORA_TARGETS = ["to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out",
                "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2"]


def make_block(width: int, heads: int, axes: list[int], seed: int = 0, zero_cond_t: bool = False):
    """A diffusers block with random weights (norm weights away from 1, LoRA B nonzero so every LoRA
    parameter has a gradient) and its RoPE module."""
    torch.manual_seed(seed)
    with torch.device("meta"):  # filled below: diffusers' own init of a real-width block takes ~40 s here
        block = QwenImageTransformerBlock(width, heads, width // heads, zero_cond_t=zero_cond_t)
    block.to_empty(device="cpu")
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.normal_(std=min(0.2, width ** -0.5)) if p.dim() > 1 else p.normal_(std=0.02)
        for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            getattr(block.attn, name).weight.uniform_(0.5, 1.5)
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, target_modules=LORA_TARGETS), block)
    with torch.no_grad():
        for name, p in block.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.02)
    return block, QwenEmbedRope(theta=10000, axes_dim=axes, scale_rope=True)


def inputs(block, rope, grid=(1, 4, 4), text=5, batch=1, mask=None, seed=1, dtype=torch.float32, index=None):
    g = torch.Generator().manual_seed(seed)
    width = block.dim
    temb_rows = 2 * batch if block.zero_cond_t else batch
    return dict(
        hidden_states=torch.randn(batch, grid[0] * grid[1] * grid[2], width, generator=g).to(dtype),
        encoder_hidden_states=torch.randn(batch, text, width, generator=g).to(dtype),
        encoder_hidden_states_mask=mask, temb=torch.randn(temb_rows, width, generator=g).to(dtype),
        image_rotary_emb=rope([[grid]] * batch, max_txt_seq_len=text, device=torch.device("cpu")),
        modulate_index=index)


def forward_backward(block, kwargs):
    """(outputs, loss, {LoRA parameter name: gradient}) of a fixed weighted sum of both streams' outputs."""
    block.zero_grad(set_to_none=True)
    text, image = block(**kwargs)
    g = torch.Generator().manual_seed(7)
    loss = (text.float() * torch.randn(text.shape, generator=g)).sum() + (
        image.float() * torch.randn(image.shape, generator=g)).sum()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in block.named_parameters() if p.requires_grad}
    return (text.detach(), image.detach()), loss.detach(), grads


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def compare(block, kwargs, mode: str, allow_cpu_compile: bool = False):
    """The largest relative difference of outputs, loss and LoRA gradients: fused `mode` against diffusers."""
    ref_out, ref_loss, ref_grads = forward_backward(block, kwargs)
    installed = fused_block.install([block], mode, SDPA, torch.device("cpu"), allow_cpu_compile=allow_cpu_compile)
    try:
        assert installed.mode == mode
        out, loss, grads = forward_backward(block, kwargs)
    finally:
        installed.uninstall()
    assert grads.keys() == ref_grads.keys() and len(grads) == 2 * len(LORA_TARGETS)
    assert all(g.abs().sum() > 0 for g in ref_grads.values())
    diffs = [relative(a, b) for a, b in zip(out, ref_out)] + [relative(loss, ref_loss)]
    diffs += [relative(grads[n], ref_grads[n]) for n in ref_grads]
    return max(diffs)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_eager_fused_block_equals_diffusers_tiny(dtype, tolerance):
    block, rope = make_block(32, 2, [8, 4, 4])
    block.to(dtype)
    assert compare(block, inputs(block, rope, dtype=dtype), fused_block.EAGER) <= tolerance


def test_uninstall_gives_diffusers_block_back():
    block, rope = make_block(32, 2, [8, 4, 4])
    kwargs = inputs(block, rope)
    before = block(**kwargs)
    processor = block.attn.processor
    installed = fused_block.install([block], fused_block.EAGER, SDPA, torch.device("cpu"))
    assert "forward" in block.__dict__ and block.attn.processor is not processor
    installed.uninstall()
    assert "forward" not in block.__dict__ and block.attn.processor is processor
    assert all(torch.equal(a, b) for a, b in zip(before, block(**kwargs)))


def test_padded_mask_kept_and_full_mask_dropped():
    """A padded text mask gives diffusers' masked result; an all-ones mask is dropped (no masked kernel) and gives
    the unmasked result, which equals diffusers' with that mask."""
    block, rope = make_block(32, 2, [8, 4, 4])
    padded = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)  # as the transformer hands it on
    assert compare(block, inputs(block, rope, batch=2, mask=padded), fused_block.EAGER) <= 1e-6
    full = torch.ones(2, 5, dtype=torch.bool)
    processor = fused_block.FusedQwenAttnProcessor(fused_block.EAGER_OPS)
    assert processor.joint_mask(full, 16) is None and processor.joint_mask(padded, 16).shape == (2, 1, 1, 21)
    masked_ref, _, _ = forward_backward(block, inputs(block, rope, batch=2, mask=full))
    installed = fused_block.install([block], fused_block.EAGER, SDPA, torch.device("cpu"))
    unmasked, _, _ = forward_backward(block, inputs(block, rope, batch=2, mask=None))
    installed.uninstall()
    assert max(relative(a, b) for a, b in zip(unmasked, masked_ref)) <= 1e-6


def test_edit_2511_modulate_index():
    """Edit-2511's zero_cond_t block: the modulation's two halves chosen per token by the index."""
    block, rope = make_block(32, 2, [8, 4, 4], zero_cond_t=True)
    index = torch.tensor([[0] * 10 + [1] * 6])
    assert compare(block, inputs(block, rope, index=index), fused_block.EAGER) <= 1e-6


@pytest.mark.slow
def test_compiled_fused_block_equals_diffusers_and_compiles_once_for_all_blocks():
    """Compiled (Inductor's C++ backend here), the same within fp32 rounding; a second block with the same
    shapes compiles nothing more (one graph per shape serves every block)."""
    from torch._dynamo.utils import counters

    first, rope = make_block(32, 2, [8, 4, 4], seed=0)
    second, _ = make_block(32, 2, [8, 4, 4], seed=3)
    kwargs = inputs(first, rope, text=16)  # as many text as image tokens: one shape, half the graphs to compile
    assert compare(first, kwargs, fused_block.COMPILED, allow_cpu_compile=True) <= 1e-5
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0
    assert compare(second, kwargs, fused_block.COMPILED, allow_cpu_compile=True) <= 1e-5
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.slow
def test_eager_fused_block_equals_diffusers_real_width():
    """One block at the real width (3072, 24 heads of 128, diffusers' default RoPE axes), few tokens, fp32. (bf16
    at this width takes a minute on this CPU: bf16 at the real head size is the next test's.)"""
    block, rope = make_block(3072, 24, [16, 56, 56])
    assert compare(block, inputs(block, rope, grid=(1, 4, 4), text=8), fused_block.EAGER) <= 1e-6


def test_eager_fused_block_equals_diffusers_real_head_size_bf16():
    """bf16 at the real head size (2 heads of 128) and RoPE axes: the norm and rotation at their real shapes."""
    block, rope = make_block(256, 2, [16, 56, 56])
    block.to(torch.bfloat16)
    assert compare(block, inputs(block, rope, grid=(1, 4, 4), text=8, dtype=torch.bfloat16),
                   fused_block.EAGER) <= 1e-2


def test_modes_and_fallback():
    cpu = torch.device("cpu")
    assert fused_block.ops_for(fused_block.OFF, cpu) is None
    assert fused_block.ops_for(fused_block.AUTO, cpu) is None  # diffusers' block until a GPU has measured ours
    assert fused_block.ops_for(fused_block.COMPILED, cpu).mode == fused_block.EAGER
    with pytest.raises(ValueError, match="fused_blocks"):
        fused_block.ops_for("fast", cpu)
