"""Host cross-check: the files `export-tiny` writes load into ComfyUI's own module classes with strict key
matching, and ComfyUI's modules compute what our diffusers/transformers modules compute from them; our
LoRA files in every layout are applied by ComfyUI's own LoRA code at the trained strength.

This proves the layouts are ComfyUI's, not merely consistent with our own reader. Needs COMFYUI_PATH (a
ComfyUI checkout) and COMFYUI_PYTHON (a Python with ComfyUI's requirements; default: this one). ComfyUI
runs in a subprocess (tests/host/comfy_layout_probe.py) that writes no bytecode into the checkout.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from comfy_probe import run_probe
from trainer_core.models.latents import pack_latents, unpack_latents
from trainer_core.models.text_encoder_file import load_text_encoder_file
from trainer_core.models.transformer_file import load_transformer_file
from trainer_core.models.vae_file import load_vae_file

COMFYUI = os.environ.get("COMFYUI_PATH")
pytestmark = pytest.mark.skipif(
    not COMFYUI, reason="COMFYUI_PATH is not set: point it at a ComfyUI checkout (and COMFYUI_PYTHON at a Python "
                        "with ComfyUI's requirements) to load our files into ComfyUI's own modules")

# Max |ComfyUI - ours| allowed, fp32 compute on both sides. The implementations differ in operation
# order only (measured ~1e-7); a wrong mapping or scale gives differences of order 1. ComfyUI's
# scaled-fp8 Linear is created in float8 as a whole, so it rounds the file's bf16 biases to float8
# (measured 2e-2 here, where the tiny transformer's biases are random; the tiny text encoder's are 0);
# `_file_biases` is the same ComfyUI module with the file's biases put back: the layout alone.
TOLERANCE = {"transformer_bf16": 1e-5, "transformer_fp8_e4m3fn": 1e-5, "transformer_fp8_e4m3fn_scaled": 1e-1,
             "transformer_fp8_e4m3fn_scaled_file_biases": 1e-5, "vae_encode": 1e-5, "vae_decode": 1e-5,
             "text_encoder_bf16": 1e-5, "text_encoder_fp8_scaled": 1e-5}


def probe_inputs(tokenizer) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "latents": torch.randn(1, 4, 1, 8, 8, generator=g),  # (B, C, T, h, w): an even 4x4 token grid
        "timestep": torch.tensor([0.37]),
        "context": torch.randn(1, 6, 16, generator=g),  # (B, L, joint dim)
        "image": torch.rand(1, 3, 1, 32, 32, generator=g) * 2 - 1,  # (B, 3, T, H, W)
        "raw_latents": torch.randn(1, 4, 1, 8, 8, generator=g),
        "input_ids": tokenizer(["a red circle on a white background"], return_tensors="pt").input_ids,
    }


@torch.no_grad()
def our_outputs(files: dict[str, Path], inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    latents = inputs["latents"][:, :, 0]  # (B, C, h, w)
    for name in ("transformer_bf16", "transformer_fp8_e4m3fn", "transformer_fp8_e4m3fn_scaled"):
        model = load_transformer_file(files[name], storage="float32", compute_dtype=torch.float32)
        packed = model(hidden_states=pack_latents(latents), encoder_hidden_states=inputs["context"],
                       timestep=inputs["timestep"], img_shapes=[[(1, 4, 4)]], return_dict=False)[0]
        out[name] = unpack_latents(packed, 8, 8).unsqueeze(2)  # (B, C, 1, h, w) as ComfyUI returns it
    out["transformer_fp8_e4m3fn_scaled_file_biases"] = out["transformer_fp8_e4m3fn_scaled"]
    vae = load_vae_file(files["vae"], compute_dtype=torch.float32)
    out["vae_encode"] = vae.encode(inputs["image"]).latent_dist.mode()
    out["vae_decode"] = vae.decode(inputs["raw_latents"]).sample
    for name in ("text_encoder_bf16", "text_encoder_fp8_scaled"):
        encoder = load_text_encoder_file(files[name], compute_dtype=torch.float32)
        out[name] = encoder(input_ids=inputs["input_ids"], output_hidden_states=True).hidden_states[-1]
    return out


def test_exported_files_are_comfyuis_layouts(tiny_files, trained_lora, tmp_path):
    from trainer_core.adapters.lora import adapter_weights
    from trainer_core.adapters.lora_files import LORA_LAYOUTS
    from trainer_core.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_files["tokenizer"], tiny_files["text_encoder_bf16"], vocab_rows=10**9)
    inputs = probe_inputs(tokenizer)
    save_file(inputs, str(tmp_path / "inputs.safetensors"))
    loras = {layout: str(trained_lora.save_lora(tmp_path / f"{layout}.safetensors", dtype=torch.float32, layout=layout))
             for layout in LORA_LAYOUTS}
    request = {"files": {k: str(v) for k, v in tiny_files.items()}, "inputs": str(tmp_path / "inputs.safetensors"),
               "out": str(tmp_path / "comfy_out.safetensors"), "loras": loras}
    (tmp_path / "request.json").write_text(json.dumps(request))
    run_probe("comfy_layout_probe.py", COMFYUI, tmp_path / "request.json", timeout=600)
    theirs = load_file(request["out"])

    # LoRA files: every key loaded by ComfyUI, each weight changed by exactly alpha / rank * B @ A.
    assert theirs.pop("lora_keys_not_loaded").item() == 0
    scale = trained_lora.lora_cfg.alpha / trained_lora.lora_cfg.rank
    deltas = {f"diffusion_model.{m}.weight": scale * b.detach() @ a.detach()
              for m, (a, b) in adapter_weights(trained_lora.built.transformer).items()}
    for layout in loras:
        patched = {k[len(f"lora.{layout}."):]: theirs.pop(k) for k in list(theirs) if k.startswith(f"lora.{layout}.")}
        assert patched.keys() == deltas.keys(), layout
        lora_difference = max((patched[k] - deltas[k]).abs().max().item() for k in deltas)
        print(f"LoRA {layout}: max |ComfyUI's weight change - alpha/rank * B @ A| = {lora_difference:.2e}")
        assert lora_difference < 1e-6, layout

    ours = our_outputs(tiny_files, inputs)
    assert set(theirs) == set(ours) == set(TOLERANCE)
    differences = {k: (ours[k] - theirs[k]).abs().max().item() for k in ours}
    print("max |ComfyUI - ours|:", json.dumps(differences, indent=1))
    for name, difference in differences.items():
        assert ours[name].shape == theirs[name].shape, name
        assert difference <= TOLERANCE[name], (name, difference)
