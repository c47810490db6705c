"""The LoRA files we save for the REAL-size Qwen-Image (60 blocks, 3072 wide) map onto ComfyUI's key map with
no key left over, in every layout.

The adapter is injected into the real transformer built on the meta device (no weight exists) with a tiny
rank, so the files have the real key set and real widths at a few MB; they are written by the writer
`Trainer.save_lora` uses (`lora_files.lora_file_tensors` + `lora_metadata`). Without ComfyUI the files
are checked against ComfyUI's rules as restated in tests/host/comfy_lora_rules.py; with COMFYUI_PATH (and
COMFYUI_PYTHON) ComfyUI itself detects its real-size Qwen-Image from the transformer's tensor names and
shapes, builds it on the meta device and loads the files with its own key map (comfy_realsize_lora_probe.py).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from comfy_lora_rules import comfy_key_map, unmatched_keys
from trainer_core.core.config import LORA_LAYOUTS, LoraConfig
from trainer_core.core.files import write_safetensors_atomic
from trainer_core.adapters.lora import inject_lora, lora_layers
from trainer_core.adapters.lora_files import layout_metadata, lora_file_tensors, lora_metadata
from trainer_core.models.qwen_arch import DEAD_IN_LAST_BLOCK, LORA_TARGET_PRESETS
from trainer_core.models.streaming import empty_transformer

RANK = 2  # the key set and the widths do not depend on the rank; a small one keeps the files small
COMFYUI = os.environ.get("COMFYUI_PATH")


@pytest.fixture(scope="module")
def realsize(tmp_path_factory):
    """The real transformer's tensor shapes (a JSON file) and our LoRA file for it in each layout, targets
    'all' (every Linear of every block: the other presets' keys are subsets), and the adapted module names."""
    folder = tmp_path_factory.mktemp("realsize_lora")
    model = empty_transformer({})
    shapes = {name: list(t.shape) for name, t in model.state_dict().items()}
    (folder / "shapes.json").write_text(json.dumps(shapes))
    cfg = LoraConfig(rank=RANK, alpha=4.0, targets="all")
    inject_lora(model, cfg, seed=0, device="cpu")  # the weights stay on meta, the adapter is real
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.01)  # as after training (B starts at zero)
    files = {}
    for layout in LORA_LAYOUTS:
        path = folder / f"realsize_{layout}.safetensors"
        meta = lora_metadata(cfg, 100, "qwen_image_fp8_e4m3fn", layout_metadata(layout, RANK, cfg.alpha))
        write_safetensors_atomic(lora_file_tensors(model, RANK, cfg.alpha, torch.bfloat16, layout), path, meta)
        files[layout] = path
    return folder / "shapes.json", files, sorted(lora_layers(model))


def test_realsize_files_hold_every_block_at_real_width(realsize):
    _, files, modules = realsize
    # 60 blocks x 14 Linears, less the last block's text-stream modules (their output never reaches the loss),
    # as lora.target_module_names says.
    assert len(modules) == 60 * len(LORA_TARGET_PRESETS["all"]) - len(DEAD_IN_LAST_BLOCK)
    tensors = load_file(str(files["comfyui"]))
    assert len(tensors) == 3 * len(modules)  # lora_A, lora_B, alpha
    a = tensors["diffusion_model.transformer_blocks.0.img_mlp.net.0.proj.lora_A.weight"]
    b = tensors["diffusion_model.transformer_blocks.0.img_mlp.net.0.proj.lora_B.weight"]
    assert a.shape == (RANK, 3072) and b.shape == (12288, RANK)


@pytest.mark.parametrize("layout", LORA_LAYOUTS)
def test_realsize_files_follow_comfyuis_key_rules(realsize, layout):
    shapes, files, _ = realsize
    key_map = comfy_key_map(json.loads(shapes.read_text()))
    assert unmatched_keys(load_file(str(files[layout])).keys(), key_map) == []


@pytest.mark.skipif(not COMFYUI, reason="COMFYUI_PATH is not set: point it at a ComfyUI checkout (and "
                                        "COMFYUI_PYTHON at a Python with ComfyUI's requirements)")
def test_realsize_files_load_into_comfyuis_realsize_model_with_no_key_left(realsize, tmp_path):
    from comfy_probe import run_probe

    shapes, files, modules = realsize
    request = tmp_path / "request.json"
    out = tmp_path / "answer.json"
    request.write_text(json.dumps({"shapes": str(shapes), "out": str(out),
                                   "loras": {layout: str(path) for layout, path in files.items()}}))
    run_probe("comfy_realsize_lora_probe.py", COMFYUI, request, timeout=600)
    answer = json.loads(out.read_text())
    assert answer["model"] == "QwenImage" and answer["blocks"] == 60
    assert answer["unet_config"]["in_channels"] == 64 and answer["unet_config"]["num_layers"] == 60
    for layout, path in files.items():
        got = answer["loras"][layout]
        assert got["not_loaded"] == [], (layout, got["not_loaded"][:5])
        assert got["bad_shapes"] == [], (layout, got["bad_shapes"][:5])
        # Every adapted module patches exactly its own weight, and every key of the file was consumed.
        assert got["patched"] == sorted(f"diffusion_model.{m}.weight" for m in modules), layout
        assert got["keys"] == len(load_file(str(path)))
        # alpha 4 at rank 2 (scale 2) in the layouts that carry alpha; diffusers' folds it into lora_B.
        assert got["alphas"] == ([None] if layout == "diffusers" else [4.0]), layout
