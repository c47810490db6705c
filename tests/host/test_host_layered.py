"""Host cross-check for Qwen-Image-Layered: ComfyUI's own model detection knows our tiny Layered transformer
file as Layered, its QwenImage transformer holds exactly the file's keys, ComfyUI's LoRA loader applies every
key of our Layered LoRA files (each layout), and ComfyUI's patched forward, with the composite as its
reference latent, equals our transformer with the live LoRA on the same inputs (frames, condition tokens,
layer-3D RoPE, `additional_t_cond`).

Needs COMFYUI_PATH (a ComfyUI with Layered: 0.33.0) and COMFYUI_PYTHON; runs tests/host/comfy_layered_probe.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from comfy_probe import run_probe
from test_layered import layered_data, layered_trainer  # noqa: F401 (fixtures)
from trainer_core.adapters.lora_files import LORA_LAYOUTS
from trainer_core.families import get_family
from trainer_core.families.qwen_image_layered.pipeline import frame_shapes, pack_frames
from trainer_core.models.latents import pack_latents

COMFYUI = os.environ.get("COMFYUI_PATH")
KNOWS_LAYERED = bool(COMFYUI) and "addition_t_embedding" in (Path(COMFYUI or ".") / "comfy" / "model_detection.py"
                                                              ).read_text()
pytestmark = [
    pytest.mark.skipif(not COMFYUI, reason="COMFYUI_PATH is not set: point it at ComfyUI 0.33.0 (and COMFYUI_PYTHON at a "
                                           "Python with its requirements)"),
    pytest.mark.skipif(bool(COMFYUI) and not KNOWS_LAYERED,
                       reason=f"the ComfyUI at {COMFYUI} has no Qwen-Image-Layered (0.3.64 has not; 0.33.0 has)"),
]
TOLERANCE = 1e-4  # fp32 on both sides; the implementations differ in operation order (measured in the note)


def unpack_frames(tokens: torch.Tensor, c: int, f: int, h: int, w: int) -> torch.Tensor:
    """(1, F * h/2 * w/2, 4C) -> (1, C, F, h, w), as ComfyUI returns its output."""
    x = tokens.view(1, f, h // 2, w // 2, c, 2, 2).permute(0, 4, 1, 2, 5, 3, 6)
    return x.reshape(1, c, f, h, w)


def test_layered_lora_loads_in_comfyui_with_every_key_and_its_forward_equals_ours(layered_trainer, tmp_path):
    trainer = layered_trainer
    files = get_family("qwen-image-layered").export_tiny(tmp_path / "models")  # the trainer's frozen base weights (seed 0)
    g = torch.Generator().manual_seed(0)
    c, f, h, w = trainer.components.vae.config.z_dim, 3, 16, 16  # 2 layers; an 8x8 token grid per frame
    inputs = {"latents": torch.randn(1, c, f, h, w, generator=g), "reference": torch.randn(1, c, 1, h, w, generator=g),
              "timestep": torch.tensor([0.37]), "context": torch.randn(1, 6, 16, generator=g)}
    save_file(inputs, str(tmp_path / "inputs.safetensors"))
    loras = {layout: str(trainer.save_lora(tmp_path / f"{layout}.safetensors", dtype=torch.float32, layout=layout))
             for layout in LORA_LAYOUTS}
    request = {"transformer": str(files["transformer_bf16"]), "loras": loras,
               "inputs": str(tmp_path / "inputs.safetensors"), "out": str(tmp_path / "out.safetensors")}
    (tmp_path / "request.json").write_text(json.dumps(request))
    result = json.loads(run_probe("comfy_layered_probe.py", COMFYUI, tmp_path / "request.json", timeout=600)
                        .stdout.strip().splitlines()[-1])
    print("ComfyUI:", result)
    assert result["detected"] == {"use_additional_t_cond": True, "default_ref_method": "negative_index"}
    assert result["missing"] == [] and result["unexpected"] == []
    assert result["lora_keys_not_loaded"] == 0
    assert all(n > 0 for n in result["patched"].values())
    theirs = load_file(request["out"])

    # Ours: the bf16 file's weights (what ComfyUI loaded) with the live LoRA, fed as the pipeline feeds it.
    transformer = trainer.built.transformer
    state = load_file(files["transformer_bf16"])
    saved = {k: v.clone() for k, v in transformer.state_dict().items()}
    base = {k.replace(".base_layer", ""): k for k in saved if "lora_" not in k}
    transformer.load_state_dict({base[k]: v.float() for k, v in state.items()}, strict=False)
    hidden = torch.cat([pack_frames(inputs["latents"]), pack_latents(inputs["reference"][:, :, 0])], dim=1)
    kwargs = dict(hidden_states=hidden, encoder_hidden_states=inputs["context"], timestep=inputs["timestep"],
                  img_shapes=[frame_shapes(f, (h // 2, w // 2))], additional_t_cond=torch.zeros(1, dtype=torch.long),
                  return_dict=False)
    was_training = transformer.training
    transformer.eval()
    try:
        with torch.no_grad():
            ours = unpack_frames(transformer(**kwargs)[0][:, : f * (h // 2) * (w // 2)], c, f, h, w)
    finally:
        transformer.load_state_dict(saved)
        transformer.train(was_training)
    differences = {k: (theirs[k] - ours).abs().max().item() for k in theirs if k.startswith("lora.")}
    print("max |ComfyUI with our LoRA - ours with the live LoRA|:", differences)
    effect = (theirs["lora.comfyui"] - theirs["plain"]).abs().max().item()
    print("the LoRA's effect (max |with - without| in ComfyUI):", effect)
    assert effect > 100 * TOLERANCE  # the LoRA does something
    assert all(d < TOLERANCE for d in differences.values()), differences
