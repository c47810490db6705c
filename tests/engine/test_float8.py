"""float8 storage of the block Linears: bytes, output closeness, and exact gradients of the frozen compute."""

import copy

import pytest
import torch
from torch import nn

from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.models.float8 import (
    FLOAT8, FrozenLinearFunction, block_linear_bytes, frozen_block_linears, install_frozen_compute,
)


def _forward(transformer, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 16, 16, generator=g)  # (B, tokens of a 4x4 grid, 4C)
    text = torch.randn(1, 7, 16, generator=g)
    with torch.no_grad():
        return transformer(hidden_states=x, encoder_hidden_states=text, timestep=torch.tensor([0.6]),
                           img_shapes=[[(1, 4, 4)]], return_dict=False)[0]


def test_float8_storage_halves_bytes_of_bf16_and_quarters_fp32():
    bf16 = build_tiny_components(storage="bfloat16").transformer
    f8 = build_tiny_components(storage="float8").transformer
    weights = lambda t: sum(lin.weight.numel() * lin.weight.element_size() for _, lin in frozen_block_linears(t))
    assert all(lin.weight.dtype == FLOAT8 for _, lin in frozen_block_linears(f8))
    assert weights(f8) * 2 == weights(bf16)
    assert block_linear_bytes(f8) < block_linear_bytes(bf16)
    # Layers outside the blocks and biases stay in the compute dtype.
    assert f8.img_in.weight.dtype == torch.float32 and f8.proj_out.weight.dtype == torch.float32
    assert all(lin.bias.dtype == torch.float32 for _, lin in frozen_block_linears(f8))


@pytest.mark.parametrize("mode, bound", [("float8", 0.05), ("float8_scaled", 0.05), ("bfloat16", 0.01)])
def test_float8_output_stays_close_to_full_precision(mode, bound):
    full = _forward(build_tiny_components(storage="float32").transformer)
    low = _forward(build_tiny_components(storage=mode).transformer)
    rel = ((low - full).norm() / full.norm()).item()
    assert 0 < rel < bound, f"{mode}: relative error {rel}"


def test_frozen_compute_equals_nn_linear_exactly_in_fp32():
    torch.manual_seed(0)
    reference = nn.Linear(8, 5)
    ours = copy.deepcopy(reference)
    install_frozen_compute(ours)
    x1 = torch.randn(3, 8, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    y1, y2 = reference(x1), ours(x2)
    assert torch.equal(y1, y2)
    y1.square().sum().backward()
    y2.square().sum().backward()
    assert torch.equal(x1.grad, x2.grad)
    assert ours.weight.grad is None  # frozen: no weight gradient is ever computed


def test_frozen_compute_reads_weight_again_in_backward():
    """Backward upcasts the module's current weight (what block swapping relies on) and keeps no copy."""
    lin = nn.Linear(4, 4)
    install_frozen_compute(lin)
    x = torch.randn(2, 4, requires_grad=True)
    y = FrozenLinearFunction.apply(x, lin)
    weight_at_forward = lin.weight.detach().clone()
    with torch.no_grad():
        lin.weight.mul_(2)
    y.sum().backward()
    assert torch.allclose(x.grad, torch.ones(2, 4) @ (2 * weight_at_forward))


def test_float8_transformer_trains_under_peft_lora():
    from trainer_core.core.config import LoraConfig
    from trainer_core.adapters.lora import inject_lora

    transformer = build_tiny_components(storage="float8").transformer
    params = inject_lora(transformer, LoraConfig(rank=4, alpha=4.0), seed=0)
    assert all(p.dtype == torch.float32 for p in params)
    assert all(lin.weight.dtype == FLOAT8 for _, lin in frozen_block_linears(transformer))
    for p in params:
        if p.abs().sum() == 0:  # lora_B starts at zero: make the adapter active so A gets gradients too
            p.data.normal_(0, 0.01)
    x = torch.randn(1, 16, 16)
    out = transformer(hidden_states=x, encoder_hidden_states=torch.randn(1, 5, 16), timestep=torch.tensor([0.5]),
                      img_shapes=[[(1, 4, 4)]], return_dict=False)[0]
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)


def test_scaled_float8_scales_the_output_as_scaling_the_weight_would():
    """float8_scaled computes y = (x W8^T) s + b and grad_x = (grad s) W8: in fp32 the same as x (s W8)^T + b
    and grad (s W8) up to rounding."""
    from trainer_core.models.float8 import SCALE_BUFFER, dequantized_weight, quantize_weight

    torch.manual_seed(0)
    for quantize in (lambda w: quantize_weight(w, "float8_scaled"),):
        lin = nn.Linear(64, 48)
        stored, scale = quantize(lin.weight.data * 3)
        lin.weight = nn.Parameter(stored, requires_grad=False)
        lin.register_buffer(SCALE_BUFFER, scale)
        x = torch.randn(5, 64, requires_grad=True)
        y = FrozenLinearFunction.apply(x, lin)
        w = dequantized_weight(lin, torch.float32)  # s W8, as the weight-scaling path computed it
        reference = x.detach() @ w.T + lin.bias.detach()
        assert torch.allclose(y, reference, rtol=1e-5, atol=1e-5)
        grad = torch.randn_like(y)
        y.backward(grad)
        assert torch.allclose(x.grad, grad @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["float8", "float8_scaled"])
def test_the_compiled_paths_expression_equals_the_eager_function(mode):
    """What `models.float8.compiled` hands torch.compile, run eagerly here, computes the same output and input gradient
    as `FrozenLinearFunction`, bit for bit in fp32 (compiled, see test_float8_compiled.py). The CPU is opt-in."""
    from trainer_core.models.float8 import SCALE_BUFFER, quantize_weight
    from trainer_core.models.float8.compiled import available, frozen_linear_expression

    assert not available(torch.device("cpu"))
    torch.manual_seed(0)
    lin = nn.Linear(32, 24)
    stored, scale = quantize_weight(lin.weight.data, mode)
    lin.weight = nn.Parameter(stored, requires_grad=False)
    lin.bias.requires_grad_(False)
    if scale is not None:
        lin.register_buffer(SCALE_BUFFER, scale)
    x1 = torch.randn(4, 32, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    y1 = FrozenLinearFunction.apply(x1, lin)
    y2 = frozen_linear_expression(x2, lin.weight, getattr(lin, SCALE_BUFFER, None), lin.bias)
    assert torch.equal(y1, y2)
    grad = torch.randn_like(y1)
    y1.backward(grad)
    y2.backward(grad)
    assert torch.equal(x1.grad, x2.grad)
