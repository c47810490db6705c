"""int8 compute (`models.int8_compute`, TrainConfig.int8_compute): the Linear equals a torch._int_mm computation written
out here bit for bit; it stays within a stated bound of bf16 compute of the same weights; its backward is the bf16
input gradient against the dequantised weight; float8/bf16 weights converted once at load equal ComfyUI's int8 ConvRot
layout (comfy-kitchen's quantiser, where installed); one step's loss and LoRA gradients within bound of bf16 compute;
chunked training with the path on stays bit-identical."""

import pytest
import torch
from torch import nn

from conftest import cached_demo
from test_float8_activations import tiny_forward
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.models import int8_compute as ic
from trainer_core.models.float8 import (
    EAGER,
    INT8,
    SCALE_BUFFER,
    compute_path,
    dequantized_weight,
    frozen_block_linears,
    install_frozen_compute,
    path_name,
    set_rotation_group,
)
from trainer_core.models.int8_convrot import hadamard, quantize
from trainer_core.streaming.runner import BlockRunner
from trainer_core.training import Trainer

CPU = torch.device("cpu")
# The stated bound of one int8 Linear against bf16 compute of the same (dequantised) weight, relative Frobenius error of
# the output, for Gaussian activations and weights: int8's rounding of a value is uniform in +-scale/2, scale = amax/127;
# after the rotation a row's amax is ~4 sigma, so each product carries ~4/127/sqrt(12) ~ 0.9% noise per operand; the
# activation's share is ~0.9% (the weight's is in both paths). 2% leaves room for bf16's roundings.
LINEAR_BOUND = 0.02


def int8_linear_module(fan_in: int, fan_out: int, group: int, seed: int = 0) -> nn.Linear:
    """A frozen bf16-biased Linear holding a random weight in ComfyUI's int8 layout (rotated when `group`)."""
    g = torch.Generator().manual_seed(seed)
    linear = nn.Linear(fan_in, fan_out, dtype=torch.bfloat16)
    q, scale = quantize(torch.randn(fan_out, fan_in, generator=g) * 0.05, group)
    linear.weight = nn.Parameter(q, requires_grad=False)
    linear.register_buffer(SCALE_BUFFER, scale)
    set_rotation_group(linear, group)
    with torch.no_grad():
        linear.bias.copy_(torch.randn(fan_out, generator=g) * 0.1)
    install_frozen_compute(linear)
    return linear


def int8_by_hand(x2: torch.Tensor, linear: nn.Linear, group: int) -> torch.Tensor:
    """The int8 product written out: rotate with an explicit H, per-row amax / 127, round half-even, _int_mm,
    rescale in fp32 (activation scale, then the weight's), add the bias, round to x2's dtype. x2 (M, K)."""
    m, k = x2.shape
    xr = x2 if not group else (x2.reshape(m, k // group, group) @ hadamard(group, x2.dtype)).reshape(m, k)
    sx = xr.float().abs().amax(dim=1, keepdim=True) / 127.0
    xq = torch.round(xr.float() / sx).clamp(-127, 127).to(torch.int8)
    acc = torch._int_mm(xq, linear.weight.t().contiguous())  # int32 (M, N)
    y = acc.float() * sx * linear.weight_scale.reshape(1, -1) + linear.bias.float()
    return y.to(x2.dtype)


def relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    return ((actual.detach().float() - reference.float()).norm() / reference.float().norm()).item()


@pytest.mark.parametrize("group", [0, 64, 256])
def test_the_int8_linear_is_the_int_mm_product_bit_for_bit_and_within_its_bound_of_bf16(group):
    linear = int8_linear_module(512, 96, group)
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 40, 512, generator=g) * torch.rand(3, 40, 1, generator=g) * 4).bfloat16()  # unequal rows
    x[0, 0, 7] = 60.0  # one outlier channel in one token: only that token's scale grows
    previous = ic.install([linear], CPU)
    y = linear(x)
    assert y.dtype == torch.bfloat16 and y.shape == (3, 40, 96)
    assert torch.equal(y.reshape(-1, 96), int8_by_hand(x.reshape(-1, 512), linear, group))
    bf16 = nn.functional.linear(x, dequantized_weight(linear, torch.bfloat16), linear.bias)
    error = relative_error(y, bf16)
    assert 1e-3 < error < LINEAR_BOUND  # really quantised, and within the bound
    ic.uninstall(previous)
    assert "forward" in linear.__dict__ and linear.forward.func is not ic.int8_forward


def test_backward_is_the_bf16_input_gradient_against_the_dequantised_weight():
    linear = int8_linear_module(256, 64, 256)
    ic.install([linear], CPU)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 20, 256, generator=g).bfloat16().requires_grad_(True)
    grad_y = torch.randn(2, 20, 64, generator=g).bfloat16()
    linear(x).backward(grad_y)
    reference = grad_y.float().reshape(-1, 64) @ dequantized_weight(linear, torch.float32)  # (40, 256)
    bound = 2 * 2.0 ** -7 * reference.abs().max().item()  # a few bf16 roundings of the largest value
    assert (x.grad.reshape(-1, 256).float() - reference).abs().max().item() <= bound
    assert linear.weight.grad is None


def test_shapes_int_mm_does_not_take_keep_the_eager_path():
    odd = int8_linear_module(20, 64, 4)  # K = 20: not a multiple of 8
    fine = int8_linear_module(64, 64, 64)
    previous = ic.install([odd, fine], CPU)
    assert list(previous) == [fine]
    assert ic.status(1, 2).endswith("1 keep the eager path (shapes not multiples of 8)")


@pytest.mark.parametrize("storage", ["float8", "float8_scaled", "bfloat16"])
def test_weights_converted_at_load_are_comfyuis_int8_convrot_layout(storage):
    """store_int8 quantises the dequantised weight exactly as int8_convrot.quantize (which tests/engine/test_int8_files.py
    holds against comfy-kitchen's quantiser) with group_for(in): 16 for the tiny model's 32, 64 for its 128."""
    model = build_tiny_components(seed=0, storage=storage, compute_dtype=torch.bfloat16).transformer
    before = {name: dequantized_weight(lin, torch.float32) for name, lin in frozen_block_linears(model)}
    assert ic.store_int8(model) == len(before)
    for name, lin in frozen_block_linears(model):
        q, scale = quantize(before[name], ic.group_for(lin.in_features))
        assert lin.weight.dtype == torch.int8 and torch.equal(lin.weight, q)
        assert torch.equal(lin.weight_scale, scale) and lin.int8_rotation_group == ic.group_for(lin.in_features)
        assert relative_error(dequantized_weight(lin, torch.float32), before[name]) < 0.02
    assert ic.store_int8(model) == 0  # idempotent: int8 weights stay as they are
    assert [ic.group_for(n) for n in (3072, 12288, 32, 128, 48, 20)] == [256, 256, 16, 64, 16, 4]


def test_the_path_by_name_installs_uninstalls_and_is_an_alternative():
    assert path_name(int8_compute=True) == INT8
    with pytest.raises(ValueError, match="alternatives"):
        path_name(fp8_activations=True, int8_compute=True)
    with pytest.raises(UserInputError, match="int8_compute"):
        TrainConfig(compile_float8=True, int8_compute=True)
    model = build_tiny_components(seed=0, storage="float8", compute_dtype=torch.bfloat16).transformer
    linears = [lin for _, lin in frozen_block_linears(model)]
    installed = compute_path(INT8).install(linears, CPU)  # float8 weights: not int8 yet, nothing to install
    assert installed.name == EAGER and installed.status.startswith("int8 compute: off")
    ic.store_int8(model)
    eager = tiny_forward(model)
    before = [lin.__dict__.get("forward") for lin in linears]
    installed = compute_path(INT8).install(linears, CPU)
    assert installed.name == INT8 and "28 of 28 block Linears" in installed.status
    with_int8 = tiny_forward(model)
    assert not torch.equal(with_int8, eager) and relative_error(with_int8, eager) < 0.05
    installed.uninstall()
    assert [lin.__dict__.get("forward") for lin in linears] == before
    assert torch.equal(tiny_forward(model), eager)
    runner = BlockRunner(model, CPU, blocks_to_swap=1, int8_compute=True)
    assert "int8 compute: on" in runner.fp8_status
    assert torch.equal(tiny_forward(model), with_int8)  # a streamed block computes as a resident one
    runner.uninstall()


def int8_trainer(tmp_path, demo_folder, int8_compute: bool, swap: int = 1, held_in_int8: bool = False) -> Trainer:
    """`held_in_int8`: the blocks converted to int8 before the trainer (for bf16 compute of the same weights)."""
    components = build_tiny_components(seed=0, storage="float8", compute_dtype=torch.bfloat16)
    if held_in_int8:
        ic.store_int8(components.transformer)
    cached = cached_demo(components, demo_folder, tmp_path / "cache")
    return Trainer(components, cached, LoraConfig(rank=4, alpha=4.0),
                   OptimizerConfig(optimizer="adamw", learning_rate=1e-3, weight_decay=0.0, warmup_steps=0),
                   TrainConfig(seed=1, blocks_to_swap=swap, int8_compute=int8_compute))


def test_one_step_loss_and_lora_gradients_within_bound_of_bf16_compute_and_chunked_training_bit_identical(
        tmp_path, demo_folder):
    """bf16 compute, float8 blocks converted to int8 at load, a streamed block, checkpointing (the recompute runs the int8
    path again): 2 + 2 steps equal 4 steps bit for bit; the first loss within 2% and the LoRA gradients of the first step
    within 10% (relative norm) of bf16 compute on the same batch and weights (the weights as int8 holds them)."""
    whole = int8_trainer(tmp_path, demo_folder, True)
    assert "int8 compute: on" in whole.memory_plan and "rotated and quantised to int8 at load" in whole.memory_plan
    losses = whole.train(4).losses
    after = [p.detach().clone() for p in whole.built.params]
    whole.close()
    chunked = int8_trainer(tmp_path, demo_folder, True)
    assert chunked.train(2).losses + chunked.train(2).losses == losses
    assert all(torch.equal(a, b) for a, b in zip(after, chunked.built.params))
    chunked.close()

    def first_step(int8: bool):
        trainer = int8_trainer(tmp_path, demo_folder, int8, swap=0, held_in_int8=True)
        grads = {}
        hooks = [p.register_hook(lambda g, i=i: grads.__setitem__(i, g.detach().float().clone()))
                 for i, p in enumerate(trainer.built.params)]
        loss = trainer.train(1).losses[0]
        for h in hooks:
            h.remove()
        trainer.close()
        return loss, torch.cat([grads[i].reshape(-1) for i in sorted(grads)])

    loss8, grad8 = first_step(True)
    loss16, grad16 = first_step(False)
    assert loss8 != loss16 and abs(loss8 - loss16) / loss16 < 0.02
    assert 0 < relative_error(grad8, grad16) < 0.10


def test_resume_from_a_checkpoint_with_int8_compute_is_bit_identical(tmp_path, demo_folder):
    """2 steps, a checkpoint, a new trainer on a freshly loaded model (its float8 weights converted to int8 again at
    load), resumed, 2 more steps: the LoRA equals 4 steps in one run bit for bit."""
    def make(run: str) -> Trainer:
        components = build_tiny_components(seed=0, storage="float8", compute_dtype=torch.bfloat16)
        cached = cached_demo(components, demo_folder, tmp_path / "cache")
        return Trainer(components, cached, LoraConfig(rank=4, alpha=4.0),
                       OptimizerConfig(optimizer="adamw", learning_rate=1e-3, weight_decay=0.0, warmup_steps=0),
                       TrainConfig(seed=1, blocks_to_swap=1, int8_compute=True), run_dir=tmp_path / run)

    whole = make("whole")
    whole.train(4)
    after = [p.detach().clone() for p in whole.built.params]
    whole.close()
    split = make("split")
    split.train(2)
    split.close()
    again = make("split")
    assert again.resume() and again.step == 2
    again.train(2)
    assert all(torch.equal(a, b) for a, b in zip(after, again.built.params))
    again.close()
