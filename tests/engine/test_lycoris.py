"""LoKr and LoHa (adapters/lycoris.py): settings, training on float8 streamed blocks, bit-exact resume, the saved
file's delta against peft's own `get_delta_weight`, and the memory plan's parameter count against peft's model.

The saved file's delta is rebuilt here with ComfyUI's formulas restated (comfy/weight_adapter/lokr.py and
loha.py, `calculate_weight`: alpha / rank where LoKr has a decomposed factor, else 1); the host test
(tests/host/test_host_lycoris.py) runs ComfyUI's own loader on the same files."""

from __future__ import annotations

import pytest
import torch

from conftest import cached_demo
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.training import Trainer

# The tiny model's Linears (32 wide, MLP 128, modulation 192) at rank 4: every LoKr case occurs, w1 and w2 kept
# whole (attention), w2 decomposed (MLP, modulation), and with decompose_both w1 too.
SETTINGS = {
    "lokr": LoraConfig(rank=4, alpha=6.0, targets="all", adapter="lokr"),
    "lokr_both_factor_8": LoraConfig(rank=2, alpha=3.0, targets="all", adapter="lokr", lokr_factor=8,
                                     lokr_decompose_both=True),
    "loha": LoraConfig(rank=4, alpha=6.0, targets="all", adapter="loha"),
}


def adapter_tensors(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in zip(trainer.built.param_names, trainer.built.params)}


def make(tmp_path, demo_folder, cache, lora, run="run", steps=0, **train):
    """A trainer on float8 blocks with one block streamed, "all" targets (the modulation Linears' outputs come
    from the plan while their weights are placeholders), two micro-batches of two per step."""
    components = build_tiny_components(seed=0, storage="float8")
    cached = cached_demo(components, demo_folder, cache)
    trainer = Trainer(components, cached, lora, OptimizerConfig(optimizer="adamw", learning_rate=5e-3),
                      TrainConfig(seed=3, micro_batch_size=2, grad_accum_steps=2, blocks_to_swap=1,
                                  checkpoint_every=0, **train),
                      run_dir=tmp_path / run)
    if steps:
        trainer.train(steps)
    return trainer


@pytest.mark.parametrize("bad, message", [
    (dict(adapter="lokr", dropout=0.1), "no input dropout|have none"),
    (dict(adapter="lora", lokr_factor=0), "lokr_factor"),
    (dict(adapter="dora"), "adapter"),
])
def test_bad_adapter_settings_are_refused_with_a_message_naming_them(bad, message):
    with pytest.raises(UserInputError, match=message):
        LoraConfig(**bad)


@pytest.mark.parametrize("name", ["lokr", "loha"])
def test_trains_from_a_no_op_on_streamed_float8_blocks_and_resumes_bit_exactly(name, tmp_path, demo_folder,
                                                                               tiny_cache):
    """The first step's loss equals a LoRA's (both adapters start as exact no-ops on the same base path), the
    adapter moves, and 1 step + resume + 2 equal 3 in one go, bit for bit."""
    lora = SETTINGS[name]
    whole = make(tmp_path, demo_folder, tiny_cache, lora, run="whole", steps=3)
    plain = make(tmp_path, demo_folder, tiny_cache, LoraConfig(rank=4, alpha=6.0, targets="all"), run="plain",
                 steps=1)
    assert whole.progress.loss_history[0] == plain.progress.loss_history[0]
    plain.close()
    assert whole.built.runner.swapper is not None and whole.components.storage == "float8"
    assert any(p.abs().max() > 0 for p in whole.built.params)
    expected = adapter_tensors(whole)
    whole.close()

    split = make(tmp_path, demo_folder, tiny_cache, lora, run="split", steps=1)
    split.save_checkpoint()
    split.close()
    again = make(tmp_path, demo_folder, tiny_cache, lora, run="split")
    assert again.resume() and again.step == 1
    again.train(2)
    got = adapter_tensors(again)
    assert got.keys() == expected.keys()
    for key in expected:
        assert torch.equal(got[key], expected[key]), key
    again.close()


def test_a_checkpoint_of_another_adapter_is_refused(tmp_path, demo_folder, tiny_cache):
    first = make(tmp_path, demo_folder, tiny_cache, SETTINGS["lokr"], steps=1)
    first.save_checkpoint()
    first.close()
    other = make(tmp_path, demo_folder, tiny_cache, SETTINGS["loha"])
    with pytest.raises(UserInputError, match="adapter: checkpoint 'lokr', now 'loha'"):
        other.resume()
    other.close()


def comfyui_delta(tensors: dict[str, torch.Tensor], stem: str) -> torch.Tensor:
    """ComfyUI's weight change at strength 1 for the module `stem`, restated from calculate_weight."""
    t = {k[len(stem) + 1:]: v.double() for k, v in tensors.items() if k.startswith(stem + ".")}
    alpha = t["alpha"].item() if "alpha" in t else None
    if "hada_w1_a" in t:
        scale = alpha / t["hada_w1_b"].shape[0] if alpha is not None else 1.0
        return scale * (t["hada_w1_a"] @ t["hada_w1_b"]) * (t["hada_w2_a"] @ t["hada_w2_b"])
    dim = None
    w1 = t.get("lokr_w1")
    if w1 is None:
        dim = t["lokr_w1_b"].shape[0]
        w1 = t["lokr_w1_a"] @ t["lokr_w1_b"]
    w2 = t.get("lokr_w2")
    if w2 is None:
        dim = t["lokr_w2_b"].shape[0]
        w2 = t["lokr_w2_a"] @ t["lokr_w2_b"]
    scale = alpha / dim if alpha is not None and dim is not None else 1.0
    return scale * torch.kron(w1, w2)


@pytest.fixture(scope="module")
def trained(tiny_cache, demo_folder):
    """One fp32 trainer per setting after 2 steps (float32 blocks, no streaming: the file's delta is the point)."""
    out = {}
    for name, lora in SETTINGS.items():
        components = build_tiny_components(seed=0, storage="float32")
        trainer = Trainer(components, cached_demo(components, demo_folder, tiny_cache), lora,
                          OptimizerConfig(optimizer="adamw", learning_rate=5e-3), TrainConfig(run_name=name))
        trainer.train(2)
        out[name] = trainer
    return out


@pytest.mark.parametrize("name", list(SETTINGS))
@pytest.mark.parametrize("layout, prefix", [("comfyui", "diffusion_model."), ("kohya", "lora_unet_")])
def test_the_saved_files_delta_is_peft_s_delta(trained, name, layout, prefix):
    from trainer_core.adapters.lycoris import ADAPTER, lycoris_layers

    trainer = trained[name]
    tensors = trainer.lora_state_dict(dtype=torch.float32, layout=layout)
    layers = lycoris_layers(trainer.built.transformer)
    assert len(layers) == len(trainer.decided.modules)
    kinds = set()
    for module, layer in layers.items():
        stem = prefix + (module if layout == "comfyui" else module.replace(".", "_"))
        kinds.add(tuple(sorted(k[len(stem) + 1:] for k in tensors if k.startswith(stem + "."))))
        peft_delta = layer.get_delta_weight(ADAPTER).double()
        assert peft_delta.abs().max() > 0, module
        torch.testing.assert_close(comfyui_delta(tensors, stem), peft_delta, rtol=1e-6, atol=1e-9)
    assert sum(len(k) for k in kinds) and all(k for k in kinds)
    if name == "lokr":  # both kinds of module occur: whole factors (no alpha) and a decomposed w2 (alpha)
        assert ("lokr_w1", "lokr_w2") in kinds and ("alpha", "lokr_w1", "lokr_w2_a", "lokr_w2_b") in kinds
    if name == "lokr_both_factor_8":
        assert ("alpha", "lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b") in kinds
    meta = trainer.lora_metadata(layout)
    assert meta["qwen_lora.adapter"] == SETTINGS[name].adapter and meta["ss_network_module"] == "lycoris.kohya"


def test_the_diffusers_layout_and_continuing_a_file_are_refused_for_lycoris(trained, tmp_path):
    with pytest.raises(UserInputError, match="diffusers loads no LoKr or LoHa"):
        trained["loha"].lora_state_dict(layout="diffusers")
    path = trained["lokr"].save_lora(tmp_path / "lokr.safetensors")
    components = build_tiny_components(seed=0, storage="float32")
    with pytest.raises(UserInputError, match="not a plain LoRA"):
        Trainer(components, trained["lokr"].dataset, LoraConfig(), OptimizerConfig(), TrainConfig(run_name="c"),
                init_lora=path)
    with pytest.raises(UserInputError, match="adapter=loha"):
        Trainer(components, trained["lokr"].dataset, LoraConfig(adapter="loha"), OptimizerConfig(),
                TrainConfig(run_name="c"), init_lora=path)


@pytest.mark.parametrize("lora", [LoraConfig(rank=4, targets="all"), *SETTINGS.values(),
                                  LoraConfig(rank=16, targets="attention+mlp", adapter="lokr", lokr_factor=4),
                                  LoraConfig(rank=1, targets="attention", adapter="loha")],
                         ids=lambda c: f"{c.adapter}-{c.targets}-r{c.rank}-f{c.lokr_factor}-{c.lokr_decompose_both}")
def test_the_memory_plan_counts_peft_s_parameters(lora, tiny):
    """The planner's adapter tensors (parameter count, and the shapes its optimizer-state formulas take) are
    those of the peft model on the tiny transformer; the model's own numbers are read the same with it."""
    from trainer_core.adapters.lora import inject_lora
    from trainer_core.planner.arch import arch_from_transformer
    from trainer_core.planner.plan import PlanInputs, adapter_settings, lora_tensor_shapes, lora_tensor_sizes

    transformer = tiny.transformer
    arch = arch_from_transformer(transformer)
    inputs = PlanInputs.from_configs(lora, OptimizerConfig(), TrainConfig(blocks_to_swap=0), 64, 64)
    params = inject_lora(transformer, lora, seed=0)
    planned = lora_tensor_sizes(arch, lora.targets, lora.rank, **adapter_settings(inputs))
    assert sum(n for _, n in planned) == sum(p.numel() for p in params)
    shapes = lora_tensor_shapes(arch, lora.targets, lora.rank, **adapter_settings(inputs))
    assert sorted(shapes) == sorted(tuple(p.shape) for p in params)
    assert arch_from_transformer(transformer) == arch  # the adapter's tensors are not read as the model's own


def test_the_plan_command_takes_the_adapter(capsys):
    from trainer_core.runs.cli import main

    assert main(["plan", "--adapter", "loha", "--rank", "8", "--blocks-to-swap", "0"]) == 0
    assert "LoHa rank 8" in capsys.readouterr().out
