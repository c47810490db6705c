"""The fused LoRA (`adapters.fused_lora`: the LoRA added in place into the frozen Linear's output, A and B cast once
per change) computes what peft's own forward computes: the same loss and LoRA gradients, in fp32 to 1e-6 relative
(the in-place addmm rounds alpha * (h B^T) + y in one operation where peft rounds three) and in bf16 to bf16's
precision; LyCORIS, dropout and the modulation Linears keep peft's forward."""

import pytest
import torch
from torch import nn

from conftest import cached_demo
from trainer_core.adapters import fused_lora
from trainer_core.adapters.lora import compute_in_input_dtype, inject_lora, lora_layers, lora_parameters
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.models.float8.storage import install_frozen_compute, quantize_weight
from trainer_core.training import Trainer

FP32_TOLERANCE = 1e-6  # relative, loss and every gradient
BF16_TOLERANCE = 2e-2  # relative: a few of bf16's 2^-8 steps, the roundings peft makes and this path does not


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))


def _trainer(tmp_path, demo_folder, dtype, targets="attention+mlp", adapter="lora", dropout=0.0):
    components = build_tiny_components(seed=0, storage="float8", compute_dtype=dtype)
    cached = cached_demo(components, demo_folder, tmp_path / "cache")
    return Trainer(components, cached, LoraConfig(rank=4, alpha=8.0, dtype="float32", targets=targets,
                                                  adapter=adapter, dropout=dropout),
                   OptimizerConfig(optimizer="adamw", learning_rate=1e-3, weight_decay=0.0, warmup_steps=0),
                   TrainConfig(seed=1, gradient_checkpointing=True))


def _loss_and_grads(t) -> tuple[torch.Tensor, list[torch.Tensor]]:
    for p in t.built.params:
        p.grad = None
    loss = t.built.flow.loss(t.built.flow.draw(t.progress.micro_batches, indices=[0]))
    loss.backward()
    grads = [p.grad.detach().clone() for p in t.built.params]
    for p in t.built.params:
        p.grad = None
    return loss.detach(), grads


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, FP32_TOLERANCE), (torch.bfloat16, BF16_TOLERANCE)])
def test_tiny_model_loss_and_gradients_equal_peft(tmp_path, demo_folder, dtype, tolerance):
    t = _trainer(tmp_path, demo_folder, dtype)
    runner = t.built.runner
    assert not runner.fused_lora_layers  # off by default: its cast copies are not yet in the plan
    runner.fused_lora_layers = fused_lora.install(t.built.transformer.transformer_blocks)
    t.train(2)  # B is no longer zero: the LoRA changes the output and A gets gradients
    fused_loss, fused_grads = _loss_and_grads(t)
    fused_lora.uninstall(runner.fused_lora_layers)
    peft_loss, peft_grads = _loss_and_grads(t)
    runner.fused_lora_layers = fused_lora.install(t.built.transformer.transformer_blocks)
    again_loss, _ = _loss_and_grads(t)
    t.close()
    assert torch.equal(fused_loss, again_loss)  # deterministic: the comparison compares the paths
    assert _relative(fused_loss, peft_loss) <= tolerance, (float(fused_loss), float(peft_loss))
    assert all(g.abs().sum() > 0 for g in peft_grads)
    worst = max(_relative(f, p) for f, p in zip(fused_grads, peft_grads))
    assert worst <= tolerance, worst


def _real_width_layer(dtype: torch.dtype) -> nn.Module:
    """One 3072 -> 3072 float8 Linear (the Qwen-Image width) with a rank-32 LoRA whose B is not zero."""
    torch.manual_seed(0)
    holder = nn.Sequential(nn.Linear(3072, 3072))
    stored, _ = quantize_weight(holder[0].weight.detach() * 0.02, "float8")
    holder[0].weight = nn.Parameter(stored, requires_grad=False)
    install_frozen_compute(holder[0])
    inject_lora(holder, LoraConfig(rank=32, alpha=32.0, dtype="float32"), seed=0, modules=["0"])
    compute_in_input_dtype(holder)
    with torch.no_grad():
        for layer in lora_layers(holder).values():
            layer.lora_B["default"].weight.normal_(0, 0.02)
    return holder


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, FP32_TOLERANCE), (torch.bfloat16, BF16_TOLERANCE)])
def test_real_width_linear_output_and_gradients_equal_peft(dtype, tolerance):
    holder = _real_width_layer(dtype)
    layer = holder[0]
    x = torch.randn(2, 24, 3072, dtype=dtype, generator=torch.Generator().manual_seed(1), requires_grad=True)
    g = torch.randn(2, 24, 3072, dtype=dtype, generator=torch.Generator().manual_seed(2))
    results = {}
    for fused in (False, True):
        if fused:
            layers = fused_lora.install([holder])
            assert layers == [layer]
        y = holder(x)
        grads = torch.autograd.grad(y, [x, *lora_parameters(holder)], g)
        results[fused] = (y.detach(), grads)
    assert results[True][0].dtype == dtype
    assert _relative(results[True][0], results[False][0]) <= tolerance
    for f, p in zip(results[True][1], results[False][1]):
        assert f.dtype == p.dtype
        assert _relative(f, p) <= tolerance, _relative(f, p)


def test_casts_follow_every_change_of_a_and_b_and_accumulate_gradients():
    """bf16 compute, fp32 masters: the kept casts are used until A or B change (an optimizer step, a load), a
    forward without autograd does not leave a copy outside the graph, and two backwards before a step (gradient
    accumulation) each reach A and B."""
    holder = _real_width_layer(torch.bfloat16)
    layer = holder[0]
    params = lora_parameters(holder)
    x = torch.randn(1, 8, 3072, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(3))

    def with_fresh_casts():  # reinstalling drops the kept copies
        fused_lora.uninstall([layer])
        fused_lora.install([holder])
        with torch.no_grad():
            return holder(x)

    fused_lora.install([holder])
    with torch.no_grad():
        holder(x)  # a copy made without autograd ...
    holder(x).float().square().sum().backward()  # ... is not the one autograd uses
    first = [p.grad.clone() for p in params]
    assert all(g.abs().sum() > 0 for g in first)
    holder(x).float().square().sum().backward()  # the kept copy's graph again, before any step
    assert all(torch.equal(p.grad, 2 * f) for p, f in zip(params, first))
    torch.optim.SGD(params, lr=10.0).step()  # B changes by far more than bf16's resolution
    with torch.no_grad():
        kept = holder(x)
        stale = kept.clone()
    assert torch.equal(kept, with_fresh_casts())
    with torch.no_grad():
        params[1].copy_(torch.randn_like(params[1]))  # a load_state_dict-like write
        kept = holder(x)
    assert not torch.equal(kept, stale) and torch.equal(kept, with_fresh_casts())


def test_lycoris_dropout_and_modulation_keep_peft_forward(tmp_path, demo_folder):
    t = _trainer(tmp_path, demo_folder, torch.float32, targets="all")
    fused = set(fused_lora.install(t.built.transformer.transformer_blocks))
    layers = lora_layers(t.built.transformer)
    assert fused == {m for n, m in layers.items() if "_mod." not in n}
    assert len(fused) < len(layers)
    t.close()
    t = _trainer(tmp_path, demo_folder, torch.float32, adapter="lokr")
    assert fused_lora.install(t.built.transformer.transformer_blocks) == []
    t.close()
    # Dropout: the layer keeps its fused forward, which hands every call to peft's (dropout before A).
    holder = nn.Sequential(nn.Linear(16, 16))
    install_frozen_compute(holder[0])
    inject_lora(holder, LoraConfig(rank=2, alpha=2.0, dtype="float32", dropout=0.5), seed=0, modules=["0"])
    layer = holder[0]
    fused_lora.install([holder])
    assert not fused_lora._takes_fused_path(layer, torch.zeros(1, 16), (), {})
