"""Run by tests/host/test_host_layered.py with ComfyUI's Python: what ComfyUI makes of our Qwen-Image-Layered files.

    python comfy_layered_probe.py <comfyui checkout> <request.json>

request.json: {"transformer": a Layered transformer file (with its config JSON beside it), "loras": {layout:
LoRA file}, "inputs": a .safetensors of inputs, "out": where to write outputs}. ComfyUI's own model detection
reads the file (it knows Layered by `time_text_embed.addition_t_embedding.weight`); ComfyUI's QwenImage
transformer is built with what it detected and must hold exactly the file's keys; each LoRA goes through
ComfyUI's own key map, loader and weight patching at strength 1.0, and the patched model runs ComfyUI's
forward on the composite's latents as its reference latent (`ref_latents`, the ref method detected).
Writes {"plain": output, "lora.<layout>": output} and prints one JSON line. Nothing here imports this
repository.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path


def main() -> None:
    comfy_root, request_file = sys.argv[1], sys.argv[2]
    sys.path.insert(0, comfy_root)
    import torch
    from safetensors.torch import load_file, save_file

    from comfy.cli_args import args

    args.cpu = True
    import comfy.ldm.qwen_image.model as qwen_model
    import comfy.lora
    import comfy.model_base
    import comfy.model_detection
    import comfy.ops

    request = json.loads(Path(request_file).read_text())
    state = {k: v.float() for k, v in load_file(request["transformer"]).items()}
    detected = comfy.model_detection.detect_unet_config(state, "")
    config = json.loads(Path(request["transformer"]).with_suffix(".json").read_text())["config"]
    model = qwen_model.QwenImageTransformer2DModel(
        patch_size=config["patch_size"], in_channels=config["in_channels"], out_channels=config["out_channels"],
        num_layers=config["num_layers"], attention_head_dim=config["attention_head_dim"],
        num_attention_heads=config["num_attention_heads"], joint_attention_dim=config["joint_attention_dim"],
        axes_dims_rope=tuple(config["axes_dims_rope"]), default_ref_method=detected.get("default_ref_method", "index"),
        use_additional_t_cond=detected.get("use_additional_t_cond", False), dtype=torch.float32,
        operations=comfy.ops.manual_cast)
    result = model.load_state_dict(state, strict=False)
    inputs = load_file(request["inputs"])

    def run() -> torch.Tensor:
        with torch.no_grad():
            return model(inputs["latents"], inputs["timestep"], inputs["context"],
                         ref_latents=[inputs["reference"]]).float()

    out = {"plain": run()}
    stub = object.__new__(comfy.model_base.QwenImage)  # ComfyUI's key map reads only names and class
    object.__setattr__(stub, "state_dict", lambda: {f"diffusion_model.{k}": v for k, v in state.items()})
    object.__setattr__(stub, "model_config", types.SimpleNamespace(unet_config={"image_model": "qwen_image"}))
    key_map = comfy.lora.model_lora_keys_unet(stub, {})
    not_loaded: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: not_loaded.append(r.getMessage()) if "not loaded" in r.getMessage() else None
    logging.getLogger().addHandler(handler)
    patched_counts = {}
    for layout, path in request["loras"].items():
        patches = comfy.lora.load_lora(load_file(path), key_map)
        patched_counts[layout] = len(patches)
        for key, adapter in patches.items():
            name = key[len("diffusion_model."):]
            weight = comfy.lora.calculate_weight([(1.0, adapter, 1.0, None, None)], state[name].clone(), key)
            model.get_submodule(name.rpartition(".")[0]).weight.data.copy_(weight)
        out[f"lora.{layout}"] = run()
        model.load_state_dict(state, strict=False)  # back to the file's weights for the next layout
    save_file({k: v.contiguous() for k, v in out.items()}, request["out"])
    print(json.dumps({"detected": {k: detected.get(k) for k in ("use_additional_t_cond", "default_ref_method")},
                      "missing": result.missing_keys[:5], "unexpected": result.unexpected_keys[:5],
                      "patched": patched_counts, "lora_keys_not_loaded": len(not_loaded)}))


if __name__ == "__main__":
    main()
