"""Continue from a LoRA file: every layout reads back to the trained rank, alpha and weights, a Trainer
started from it computes what the saved adapter computed and trains on; bad files are refused by name."""

import pytest
import torch
from safetensors.torch import save_file

from conftest import cached_demo
from test_lora_format import forward_inputs
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.adapters.lora import adapter_weights
from trainer_core.adapters.lora_files import LORA_LAYOUTS
from trainer_core.adapters.lora_reading import read_lora_file
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.training import Trainer


def continued(path, demo_folder, cache_dir, lora=None):
    components = build_tiny_components(storage="float32")
    cached = cached_demo(components, demo_folder, cache_dir)
    return Trainer(components, cached, lora or LoraConfig(rank=16, alpha=1.0, targets="attention"),
                   OptimizerConfig(learning_rate=5e-3), TrainConfig(run_name="more"), init_lora=path)


@pytest.mark.parametrize("layout", LORA_LAYOUTS)
def test_float32_files_read_back_to_the_trained_weights(trained_lora, tmp_path, layout):
    lora = read_lora_file(trained_lora.save_lora(tmp_path / "l.safetensors", dtype=torch.float32, layout=layout))
    assert (lora.layout, lora.rank, lora.alpha, lora.steps) == (layout, 4, 6.0, 4)
    live = adapter_weights(trained_lora.built.transformer)
    assert sorted(lora.weights) == sorted(live)
    for module, (a, b) in live.items():
        assert torch.equal(lora.weights[module][0], a)
        # diffusers' layout stores B * alpha / rank; dividing back is exact up to one rounding
        assert torch.allclose(lora.weights[module][1], b, rtol=1e-6, atol=0) if layout == "diffusers" \
            else torch.equal(lora.weights[module][1], b)


@pytest.mark.parametrize("layout", LORA_LAYOUTS)
def test_training_continues_from_a_bf16_file_in_every_layout(trained_lora, tmp_path, demo_folder, tiny_cache, layout):
    path = trained_lora.save_lora(tmp_path / "l.safetensors", layout=layout)  # bf16, the default
    more = continued(path, demo_folder, tiny_cache)
    # The file decides rank, alpha and modules, whatever the LoRA config said.
    assert (more.decided.lora.rank, more.decided.lora.alpha, more.decided.lora.targets) == (4, 6.0, "all")
    for module, (a, b) in adapter_weights(trained_lora.built.transformer).items():
        a2, b2 = adapter_weights(more.built.transformer)[module]
        assert torch.equal(a2, a.to(torch.bfloat16).float())
        expected_b = b.to(torch.bfloat16).float() if layout != "diffusers" else (b * 1.5).to(torch.bfloat16).float() / 1.5
        assert torch.allclose(b2, expected_b, rtol=1e-6, atol=0)
    with torch.no_grad():
        saved = trained_lora.built.transformer(**forward_inputs())[0]
        now = more.built.transformer(**forward_inputs())[0]
    assert (saved - now).abs().max() < 2e-3  # the same adapter, up to bf16 rounding of its weights
    before = {n: p.detach().clone() for n, p in more.built.transformer.named_parameters() if ".lora_" in n}
    report = more.train(2)
    assert all(torch.isfinite(torch.tensor(report.losses)))
    assert any(not torch.equal(before[n], p) for n, p in more.built.transformer.named_parameters() if ".lora_" in n)
    meta = more.lora_metadata()
    assert meta["qwen_lora.steps"] == "6" and meta["qwen_lora.run_steps"] == "2"
    assert meta["qwen_lora.init_lora"] == "l.safetensors" and meta["qwen_lora.targets"] == "all"


def lora_file(path, tensors, metadata=None):
    save_file(tensors, str(path), metadata=metadata)
    return path


def pair(rank, width=16, out=16):
    return torch.randn(rank, width), torch.randn(out, rank)


def test_a_file_without_alpha_reads_with_alpha_equal_to_rank(tmp_path):
    """No `.alpha` keys and no metadata: scale 1, as loaders apply it. (Alpha from `.alpha` keys and from
    diffusers' metadata, in third-party files: test_oracles.py.)"""
    a, b = pair(2)
    bare = {"transformer_blocks.0.attn.to_q.lora_A.weight": a, "transformer_blocks.0.attn.to_q.lora_B.weight": b}
    plain = read_lora_file(lora_file(tmp_path / "bare.safetensors", bare))
    assert (plain.layout, plain.rank, plain.alpha) == ("peft", 2, 2.0)


def test_bad_lora_files_are_refused_naming_the_file_and_the_problem(tmp_path, demo_folder, tiny_cache):
    with pytest.raises(UserInputError, match=rf"{tmp_path / 'none.safetensors'} does not exist"):
        read_lora_file(tmp_path / "none.safetensors")
    (a2, b2), (a4, b4) = pair(2), pair(4)
    mixed = lora_file(tmp_path / "mixed.safetensors", {
        "diffusion_model.transformer_blocks.0.attn.to_q.lora_A.weight": a2,
        "diffusion_model.transformer_blocks.0.attn.to_q.lora_B.weight": b2,
        "diffusion_model.transformer_blocks.0.attn.to_k.lora_A.weight": a4,
        "diffusion_model.transformer_blocks.0.attn.to_k.lora_B.weight": b4})
    with pytest.raises(UserInputError, match=r"mixed\.safetensors mixes ranks \[2, 4\]"):
        read_lora_file(mixed)
    dora = lora_file(tmp_path / "dora.safetensors", {
        "diffusion_model.transformer_blocks.0.attn.to_q.lora_A.weight": a2,
        "diffusion_model.transformer_blocks.0.attn.to_q.lora_B.weight": b2,
        "diffusion_model.transformer_blocks.0.attn.to_q.dora_scale": torch.ones(16, 1)})
    with pytest.raises(UserInputError, match=r"dora\.safetensors is not a plain LoRA"):
        read_lora_file(dora)
    flux = lora_file(tmp_path / "flux.safetensors", {
        "diffusion_model.single_blocks.0.linear1.lora_A.weight": a2,
        "diffusion_model.single_blocks.0.linear1.lora_B.weight": b2})
    with pytest.raises(UserInputError, match=r"flux\.safetensors adapts 1 modules that this model does not have "
                                             r"\(first: \['single_blocks\.0\.linear1'\]\)"):
        continued(flux, demo_folder, tiny_cache)
    wide = lora_file(tmp_path / "wide.safetensors", {
        "diffusion_model.transformer_blocks.0.attn.to_q.lora_A.weight": torch.randn(2, 3072),
        "diffusion_model.transformer_blocks.0.attn.to_q.lora_B.weight": torch.randn(3072, 2)})
    with pytest.raises(UserInputError, match=r"wide\.safetensors: module transformer_blocks\.0\.attn\.to_q is "
                                             r"3072 -> 3072 wide in the file, 32 -> 32 in the model"):
        continued(wide, demo_folder, tiny_cache)
