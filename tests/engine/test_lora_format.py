"""The saved LoRA in each layout: every key maps to a model weight under ComfyUI's rules, and its metadata.
(diffusers' loader reading these files back: test_oracles.py.)"""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from comfy_lora_rules import comfy_key_map, unmatched_keys
from trainer_core.adapters.lora_files import LORA_LAYOUTS
from trainer_core.families.qwen_image import build_tiny_components

# Per layout: (prefix of every key, suffixes of one module's keys).
LAYOUT_KEYS = {
    "comfyui": ("diffusion_model.transformer_blocks.", {"lora_A.weight", "lora_B.weight", "alpha"}),
    "diffusers": ("transformer.transformer_blocks.", {"lora_A.weight", "lora_B.weight"}),
    "kohya": ("lora_unet_transformer_blocks_", {"lora_down.weight", "lora_up.weight", "alpha"}),
}
MODULES = 2 * 14 - 4  # "all" targets on 2 blocks, minus the last block's dead text-stream modules


def forward_inputs():
    g = torch.Generator().manual_seed(0)
    return dict(hidden_states=torch.randn(1, 16, 16, generator=g), encoder_hidden_states=torch.randn(1, 6, 16, generator=g),
                timestep=torch.tensor([0.4]), img_shapes=[[(1, 4, 4)]], return_dict=False)


@pytest.mark.parametrize("layout", LORA_LAYOUTS)
def test_every_key_is_in_the_layout_and_maps_under_comfyuis_rules(trained_lora, tmp_path, layout):
    path = trained_lora.save_lora(tmp_path / "lora.safetensors", layout=layout)
    tensors = load_file(str(path))
    base_keys = build_tiny_components(storage="float32").transformer.state_dict().keys()
    assert unmatched_keys(tensors.keys(), comfy_key_map(base_keys)) == []
    prefix, suffixes = LAYOUT_KEYS[layout]
    assert all(k.startswith(prefix) for k in tensors)
    modules = {k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0] for k in tensors}
    assert len(modules) == MODULES and len(tensors) == MODULES * len(suffixes)
    for m in modules:
        assert {k[len(m) + 1:] for k in tensors if k.startswith(m + ".")} == suffixes
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["qwen_lora.rank"] == "4" and float(meta["qwen_lora.alpha"]) == 6.0
    assert meta["qwen_lora.steps"] == "4" and meta["qwen_lora.targets"] == "all"
    assert meta["qwen_lora.base_model"].startswith("tiny-qwen-image")
    if layout == "diffusers":  # alpha / rank is folded into lora_B (see lora_files.py for why)
        assert float(meta["qwen_lora.lora_B_scale"]) == 1.5
