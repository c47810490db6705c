"""Host check: our LoKr and LoHa files are read by ComfyUI's own LoRA loader (0 keys not loaded), its weight
change is peft's delta, and ComfyUI's Qwen-Image transformer with the patched weights computes what our peft
model computes (tests/host/comfy_lycoris_probe.py runs ComfyUI's side). Needs COMFYUI_PATH and COMFYUI_PYTHON, like
the other host tests. Diffusers has no loader for LyCORIS files (its Qwen-Image LoRA loader converts LoRA keys
only), so there is no diffusers side."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from comfy_probe import run_probe
from test_lycoris import SETTINGS, trained  # noqa: F401 (the module fixture)
from trainer_core.adapters.lora import inject_lora
from trainer_core.adapters.lycoris import ADAPTER, lycoris_layers
from trainer_core.models.latents import pack_latents, unpack_latents
from trainer_core.models.transformer_file import load_transformer_file

COMFYUI = os.environ.get("COMFYUI_PATH")
pytestmark = pytest.mark.skipif(
    not COMFYUI, reason="COMFYUI_PATH is not set: point it at a ComfyUI checkout (and COMFYUI_PYTHON at a Python "
                        "with ComfyUI's requirements) to load our LoKr and LoHa files with ComfyUI's LoRA loader")

TOLERANCE = 1e-5  # max |ComfyUI - ours| / max(1, max |ComfyUI|), fp32 on both sides: operation order only


@torch.no_grad()
def our_forward(file, trainer, inputs) -> torch.Tensor:
    """The file's transformer with the trainer's adapter (peft's layers, our forward), fp32."""
    model = load_transformer_file(file, storage="float32", compute_dtype=torch.float32)
    if trainer is not None:
        inject_lora(model, trainer.lora_cfg, seed=0, modules=trainer.decided.modules)
        trained_tensors = dict(zip(trainer.built.param_names, trainer.built.params))
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(trained_tensors[name])
    model.eval()
    packed = model(hidden_states=pack_latents(inputs["latents"][:, :, 0]), encoder_hidden_states=inputs["context"],
                   timestep=inputs["timestep"], img_shapes=[[(1, 4, 4)]], return_dict=False)[0]
    return unpack_latents(packed, 8, 8).unsqueeze(2)  # (B, C, 1, h, w) as ComfyUI returns it


def test_comfyui_loads_lokr_and_loha_files_with_every_key_and_computes_what_peft_computes(
        trained, tiny_files, tmp_path):  # noqa: F811
    g = torch.Generator().manual_seed(0)
    inputs = {"latents": torch.randn(1, 4, 1, 8, 8, generator=g), "timestep": torch.tensor([0.37]),
              "context": torch.randn(1, 6, 16, generator=g)}
    save_file(inputs, str(tmp_path / "inputs.safetensors"))
    loras = {f"{name}.{layout}": str(trained[name].save_lora(tmp_path / f"{name}_{layout}.safetensors",
                                                              dtype=torch.float32, layout=layout))
             for name in SETTINGS for layout in ("comfyui", "kohya")}
    request = {"transformer": str(tiny_files["transformer_bf16"]), "inputs": str(tmp_path / "inputs.safetensors"),
               "out": str(tmp_path / "out.safetensors"), "loras": loras}
    (tmp_path / "request.json").write_text(json.dumps(request))
    run_probe("comfy_lycoris_probe.py", COMFYUI, tmp_path / "request.json", timeout=600)
    theirs = load_file(request["out"])

    base = our_forward(tiny_files["transformer_bf16"], None, inputs)
    scale = max(1.0, theirs["forward.base"].abs().max().item())
    assert (base - theirs["forward.base"]).abs().max().item() / scale < TOLERANCE
    for key in loras:
        name = key.split(".")[0]
        trainer = trained[name]
        assert theirs[f"not_loaded.{key}"].item() == 0, key
        deltas = {k[len(f"delta.{key}."):]: v for k, v in theirs.items() if k.startswith(f"delta.{key}.")}
        layers = lycoris_layers(trainer.built.transformer)
        assert set(deltas) == {f"diffusion_model.{m}.weight" for m in layers}, key
        worst = max((deltas[f"diffusion_model.{m}.weight"] - layer.get_delta_weight(ADAPTER)).abs().max().item()
                    for m, layer in layers.items())
        ours = our_forward(tiny_files["transformer_bf16"], trainer, inputs)
        forward = (ours - theirs[f"forward.{key}"]).abs().max().item() / scale
        moved = (ours - base).abs().max().item()
        print(f"{key}: {len(deltas)} patched weights, 0 keys not loaded, max |ComfyUI's delta - peft's| = "
              f"{worst:.2e}, forward |ComfyUI - ours| / scale = {forward:.2e} (the adapter moves it by {moved:.2e})")
        assert worst < 1e-6 and forward < TOLERANCE and moved > 100 * TOLERANCE, key
