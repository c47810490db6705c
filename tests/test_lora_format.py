"""The saved LoRA: ComfyUI layout, every key maps to a model weight, metadata, exact reload in diffusers."""

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from comfy_lora_rules import comfy_key_map, unmatched_keys
from conftest import cached_demo
from trainer_core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.models import build_tiny_components
from trainer_core.trainer import Trainer


def trained(tmp_path, demo_folder, alpha=6.0, targets="all"):
    components = build_tiny_components(storage="float32")
    cached = cached_demo(components, demo_folder, tmp_path / "cache")
    t = Trainer(components, cached, LoraConfig(rank=4, alpha=alpha, targets=targets),
                OptimizerConfig(learning_rate=5e-3), TrainConfig(run_name="fmt"))
    t.train(4)
    return t


def test_every_key_is_in_the_comfyui_layout_and_maps(tmp_path, demo_folder):
    t = trained(tmp_path, demo_folder)
    path = t.save_lora(tmp_path / "lora.safetensors")
    tensors = load_file(str(path))
    base_keys = build_tiny_components(storage="float32").transformer.state_dict().keys()
    assert unmatched_keys(tensors.keys(), comfy_key_map(base_keys)) == []
    modules = {k.rsplit(".", 2)[0] for k in tensors if k.endswith("lora_A.weight")}
    for m in modules:
        assert m.startswith("diffusion_model.transformer_blocks.")
        a, b, alpha = tensors[f"{m}.lora_A.weight"], tensors[f"{m}.lora_B.weight"], tensors[f"{m}.alpha"]
        assert a.shape[0] == 4 and b.shape[1] == 4 and alpha.item() == 6.0
    assert len(tensors) == 3 * len(modules) == 3 * (2 * 14 - 4)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["qwen_lora.rank"] == "4" and float(meta["qwen_lora.alpha"]) == 6.0
    assert meta["qwen_lora.steps"] == "4" and meta["qwen_lora.targets"] == "all"
    assert meta["qwen_lora.base_model"].startswith("tiny-qwen-image")


def test_diffusers_reload_reproduces_the_adapter_output(tmp_path, demo_folder):
    from diffusers import QwenImagePipeline

    t = trained(tmp_path, demo_folder, alpha=2.0)  # alpha != rank: the scale must survive the trip
    path = t.save_lora(tmp_path / "lora.safetensors", dtype=torch.float32)
    fresh = build_tiny_components(storage="float32")
    pipe = QwenImagePipeline(scheduler=None, vae=fresh.vae, text_encoder=None, tokenizer=None,
                             transformer=fresh.transformer)
    pipe.load_lora_weights(str(path))
    g = torch.Generator().manual_seed(0)
    inputs = dict(hidden_states=torch.randn(1, 16, 16, generator=g), encoder_hidden_states=torch.randn(1, 6, 16, generator=g),
                  timestep=torch.tensor([0.4]), img_shapes=[[(1, 4, 4)]], return_dict=False)
    with torch.no_grad():
        ours = t.transformer(**inputs)[0]
        theirs = fresh.transformer(**inputs)[0]
        base = build_tiny_components(storage="float32").transformer(**inputs)[0]
    assert (ours - base).abs().max() > 1e-4  # the adapter does something
    assert (ours - theirs).abs().max().item() < 1e-6
