"""float8 activations (`models.float8.activations`, TrainConfig.fp8_activations): the exact relation of the
float8 product, its bf16 input gradient, the Linears that keep the eager path, the flag off or uninstalled
leaving the eager path bit for bit, and chunked training with it on staying bit-identical."""

import pytest
import torch
from torch import nn

from conftest import cached_demo
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.models.float8 import activations as fa
from trainer_core.models.float8 import FLOAT8, SCALE_BUFFER, install_frozen_compute, quantize_weight
from trainer_core.streaming.runner import BlockRunner
from trainer_core.training import Trainer

BF16_ULP = 2.0 ** -7  # bf16's spacing relative to a value (8 significant bits)


def float8_linear(fan_in: int, fan_out: int, mode: str, seed: int = 0) -> nn.Linear:
    """A frozen Linear stored as `mode` (float8 or float8_scaled), with a bf16 bias, on the eager path."""
    g = torch.Generator().manual_seed(seed)
    linear = nn.Linear(fan_in, fan_out, dtype=torch.bfloat16)
    stored, scale = quantize_weight(torch.randn(fan_out, fan_in, generator=g) * 0.05, mode)
    linear.weight = nn.Parameter(stored, requires_grad=False)
    with torch.no_grad():
        linear.bias.copy_(torch.randn(fan_out, generator=g) * 0.1)
    if scale is not None:
        linear.register_buffer(SCALE_BUFFER, scale)  # (out, 1)
    install_frozen_compute(linear)
    return linear


def dequantised_weight(linear: nn.Linear) -> torch.Tensor:
    """W8 sw in fp32: (out, in)."""
    scale = getattr(linear, SCALE_BUFFER, None)
    return linear.weight.float() * (1.0 if scale is None else scale)


def activation_by_hand(x2: torch.Tensor, scaling: str) -> torch.Tensor:
    """q(x / sx) sx in fp32 with sx = amax / 448 per row or per tensor, x2 (M, K)."""
    amax = x2.float().abs().amax(dim=1, keepdim=True) if scaling == fa.ROWWISE else x2.float().abs().amax()
    sx = amax / 448.0
    return (x2.float() / sx).to(FLOAT8).float() * sx


def relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    return ((actual.detach().float() - reference).norm() / reference.norm()).item()


def close_to_bf16(actual: torch.Tensor, reference: torch.Tensor, ulps: float = 2.0) -> None:
    """Equal to an fp32 reference within a few bf16 roundings of its largest value."""
    bound = ulps * BF16_ULP * reference.abs().max().item()
    assert (actual.float() - reference).abs().max().item() <= bound


@pytest.mark.parametrize("scaling", fa.SCALINGS)
@pytest.mark.parametrize("mode", ["float8", "float8_scaled"])
def test_forward_is_the_product_of_the_dequantised_operands_and_backward_the_bf16_input_gradient(mode, scaling):
    linear = float8_linear(64, 48, mode)
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 24, 64, generator=g) * torch.rand(2, 24, 1, generator=g) * 4).bfloat16()  # rows of unequal size
    x.requires_grad_(True)
    fa.install([linear], scaling)
    y = linear(x)  # (2, 24, 48)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 24, 48)
    x2 = x.detach().reshape(-1, 64)
    reference = activation_by_hand(x2, scaling) @ dequantised_weight(linear).t() + linear.bias.float()  # (48, 48)
    close_to_bf16(y.reshape(-1, 48), reference)
    # Not the bf16 product: the activation really went through float8 (3 mantissa bits: ~2^-5 relative error,
    # against ~2^-9 to 2^-8 from the bf16 roundings of the output and of the weight scales).
    unquantised = x2.float() @ dequantised_weight(linear).t() + linear.bias.float()
    assert relative_error(y.reshape(-1, 48), unquantised) > 4 * relative_error(y.reshape(-1, 48), reference)

    grad_y = torch.randn(2, 24, 48, generator=g).bfloat16()
    y.backward(grad_y)
    grad_reference = grad_y.float().reshape(-1, 48) @ dequantised_weight(linear)  # (48, 64), fp32
    close_to_bf16(x.grad.reshape(-1, 64), grad_reference)
    assert linear.weight.grad is None  # frozen: no weight gradient


def test_shapes_and_dtypes_scaled_mm_does_not_take_keep_the_eager_path_bit_for_bit():
    odd = float8_linear(20, 48, "float8")  # in_features not a multiple of 16
    fits = float8_linear(32, 48, "float8")
    bf16 = nn.Linear(32, 48, dtype=torch.bfloat16)  # not stored in float8
    install_frozen_compute(bf16)
    x20, x32 = torch.randn(5, 20).bfloat16(), torch.randn(5, 32).bfloat16()
    eager = odd(x20), bf16(x32), fits(x32.float())
    installed = fa.install([odd, fits, bf16], fa.ROWWISE)
    assert list(installed) == [fits]
    assert torch.equal(odd(x20), eager[0]) and torch.equal(bf16(x32), eager[1])
    assert torch.equal(fits(x32.float()), eager[2])  # an fp32 input (fp32 compute) stays eager
    assert not torch.equal(fits(x32), fits.__dict__["forward"].args[1](x32))  # a bf16 input: float8
    assert fa.status(1, 3, fa.ROWWISE, True).startswith("fp8 activations: on, rowwise")


def tiny_forward(transformer) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 16, generator=g).bfloat16()  # (B, tokens of a 4x4 grid, 4C)
    text = torch.randn(1, 7, 16, generator=g).bfloat16()
    with torch.no_grad():
        return transformer(hidden_states=x, encoder_hidden_states=text, timestep=torch.tensor([0.6]),
                           img_shapes=[[(1, 4, 4)]], return_dict=False)[0]


def test_flag_off_and_uninstalled_runner_leave_the_eager_path_bit_for_bit():
    transformer = build_tiny_components(seed=0, storage="float8_scaled", compute_dtype=torch.bfloat16).transformer
    eager = tiny_forward(transformer)
    off = BlockRunner(transformer, torch.device("cpu"), fp8_activations=False)
    assert off.fp8_status is None
    assert torch.equal(tiny_forward(transformer), eager)
    off.uninstall()
    on = BlockRunner(transformer, torch.device("cpu"), blocks_to_swap=1, fp8_activations=True)
    assert on.fp8_status == "fp8 activations: on, rowwise activation scales, 28 of 28 block Linears (bfloat16 compute only)"
    with_fp8 = tiny_forward(transformer)
    assert not torch.equal(with_fp8, eager)
    assert relative_error(with_fp8, eager.float()) < 0.05
    on.uninstall()
    assert torch.equal(tiny_forward(transformer), eager)
    with pytest.raises(ValueError, match="alternatives"):
        BlockRunner(transformer, torch.device("cpu"), compile_float8=True, fp8_activations=True)


def fp8_trainer(tmp_path, demo_folder, fp8_activations: bool) -> Trainer:
    """Trainers of one test share TMP/cache: the demo dataset is encoded once per test, not per trainer."""
    components = build_tiny_components(seed=0, storage="float8", compute_dtype=torch.bfloat16)
    cached = cached_demo(components, demo_folder, tmp_path / "cache")
    return Trainer(components, cached, LoraConfig(rank=4, alpha=4.0),
                   OptimizerConfig(optimizer="adamw", learning_rate=1e-3, weight_decay=0.0, warmup_steps=0),
                   TrainConfig(seed=1, blocks_to_swap=1, fp8_activations=fp8_activations))


def test_chunked_training_with_fp8_activations_stays_bit_identical(tmp_path, demo_folder):
    """bf16 compute, float8 blocks, a streamed block, checkpointing (the recompute runs the float8 path again):
    2 + 2 steps equal 4 steps bit for bit; the losses stay near those of bf16 compute on the same batches."""
    whole = fp8_trainer(tmp_path, demo_folder, True)
    assert "fp8 activations: on" in whole.memory_plan
    losses = whole.train(4).losses
    after = [p.detach().clone() for p in whole.built.params]
    whole.close()
    chunked = fp8_trainer(tmp_path, demo_folder, True)
    assert chunked.train(2).losses + chunked.train(2).losses == losses
    assert all(torch.equal(a, b) for a, b in zip(after, chunked.built.params))
    chunked.close()
    bf16 = fp8_trainer(tmp_path, demo_folder, False)
    bf16_losses = bf16.train(4).losses
    bf16.close()
    assert bf16_losses != losses
    assert max(abs(a - b) / b for a, b in zip(losses, bf16_losses)) < 0.05


def test_compile_float8_is_an_alternative_and_says_when_it_cannot_run(tmp_path, demo_folder):
    """TrainConfig.compile_float8: refused together with fp8_activations (a message naming both); on the CPU the
    trainer keeps the eager path and its status says why (the compiled path itself: test_float8_compiled.py)."""
    from trainer_core.core.errors import UserInputError

    with pytest.raises(UserInputError, match="compile_float8, fp8_activations and int8_compute"):
        TrainConfig(compile_float8=True, fp8_activations=True).validate()
    components = build_tiny_components(seed=0, storage="float8", compute_dtype=torch.bfloat16)
    cached = cached_demo(components, demo_folder, tmp_path / "cache")
    trainer = Trainer(components, cached, LoraConfig(rank=4, alpha=4.0), OptimizerConfig(optimizer="adamw"),
                      TrainConfig(seed=1, compile_float8=True))
    try:
        assert not trainer.built.runner.compiled_float8
        assert "compiled float8: off here (it needs a CUDA GPU with Triton)" in trainer.memory_plan
        assert len(trainer.train(1).losses) == 1
    finally:
        trainer.close()
