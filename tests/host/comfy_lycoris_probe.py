"""Run by tests/host/test_host_lycoris.py with ComfyUI's Python: load our LoKr and LoHa files with ComfyUI's own LoRA
loader (comfy/lora.py: its Qwen-Image key map, load_lora, calculate_weight) and run ComfyUI's Qwen-Image
transformer with the patched weights.

    python comfy_lycoris_probe.py <comfyui checkout> <request.json>

request.json: {"transformer": a tiny transformer file (bf16, ComfyUI keys, config JSON beside it),
               "inputs": a .safetensors of latents / timestep / context, "out": output path,
               "loras": {name: path of a LoKr or LoHa file}}.
Writes, per LoRA file: `delta.<name>.<weight key>` (ComfyUI's weight change at strength 1), `forward.<name>`
(the transformer's output with every patched weight), `not_loaded.<name>` (the keys ComfyUI reports as not
loaded), and `forward.base` (no LoRA). fp32 compute. Nothing here imports this repository.
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

    args.cpu = True  # as `main.py --cpu`: comfy.model_management reads it at import
    import comfy.ldm.qwen_image.model as qwen_model
    import comfy.lora
    import comfy.model_base
    import comfy.ops

    request = json.loads(Path(request_file).read_text())
    inputs = load_file(request["inputs"])
    state = {k: v.float() for k, v in load_file(request["transformer"]).items()}
    cfg = json.loads(Path(request["transformer"]).with_suffix(".json").read_text())["config"]

    def transformer(weights: dict):
        model = qwen_model.QwenImageTransformer2DModel(
            patch_size=cfg["patch_size"], in_channels=cfg["in_channels"], out_channels=cfg["out_channels"],
            num_layers=cfg["num_layers"], attention_head_dim=cfg["attention_head_dim"],
            num_attention_heads=cfg["num_attention_heads"], joint_attention_dim=cfg["joint_attention_dim"],
            axes_dims_rope=tuple(cfg["axes_dims_rope"]), dtype=torch.float32, operations=comfy.ops.manual_cast)
        result = model.load_state_dict(weights, strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise SystemExit(f"keys differ from ComfyUI's module: {result.missing_keys[:5]} {result.unexpected_keys[:5]}")
        with torch.no_grad():
            return model(inputs["latents"], inputs["timestep"], inputs["context"]).float()

    # ComfyUI's key map for a Qwen-Image model (model_lora_keys_unet reads only the weight names and the class).
    model = object.__new__(comfy.model_base.QwenImage)
    object.__setattr__(model, "state_dict", lambda: {f"diffusion_model.{k}": v for k, v in state.items()})
    object.__setattr__(model, "model_config", types.SimpleNamespace(unet_config={"image_model": "qwen_image"}))
    key_map = comfy.lora.model_lora_keys_unet(model, {})
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger().addHandler(handler)

    out = {"forward.base": transformer(state)}
    for name, path in request["loras"].items():
        messages.clear()
        patches = comfy.lora.load_lora(load_file(path), key_map)
        out[f"not_loaded.{name}"] = torch.tensor(float(sum("not loaded" in m for m in messages)))
        errors = [m for m in messages if m.startswith("ERROR")]
        patched = dict(state)
        for key, adapter in patches.items():
            weight_key = key[len("diffusion_model."):]
            zero = torch.zeros_like(state[weight_key])
            delta = comfy.lora.calculate_weight([(1.0, adapter, 1.0, None, None)], zero, key)
            out[f"delta.{name}.{key}"] = delta
            patched[weight_key] = comfy.lora.calculate_weight([(1.0, adapter, 1.0, None, None)],
                                                              state[weight_key].clone(), key)
        if errors:
            raise SystemExit(f"{name}: ComfyUI reported {errors[:3]}")
        out[f"forward.{name}"] = transformer(patched)

    save_file({k: v.contiguous() for k, v in out.items()}, request["out"])
    print(json.dumps({"ok": sorted(k for k in out if not k.startswith("delta."))}))


if __name__ == "__main__":
    main()
