"""Run by tests/host/test_host_comfyui.py with ComfyUI's Python: what ComfyUI makes of our Qwen-Image-Edit files.

    python comfy_edit_probe.py <comfyui checkout> <request.json>

request.json: {"transformer": path of a transformer file, "lora": path of a LoRA file}. Prints one JSON line:
the ref method ComfyUI's own model detection reads from the file (0.33+: "index_timestep_zero" for Edit-2511,
from its `__index_timestep_zero__` key; None where this ComfyUI knows no such method), whether ComfyUI's
QwenImage transformer built with that method has exactly the file's keys, and how many LoRA keys ComfyUI's
own key map and loader leave unloaded for that model. Nothing here imports this repository.
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
    import inspect

    import torch
    from safetensors.torch import load_file

    from comfy.cli_args import args

    args.cpu = True
    import comfy.ldm.qwen_image.model as qwen_model
    import comfy.lora
    import comfy.model_base
    import comfy.model_detection
    import comfy.ops

    request = json.loads(Path(request_file).read_text())
    state = load_file(request["transformer"])
    detected = comfy.model_detection.detect_unet_config(state, "")
    ref_method = detected.get("default_ref_method")
    config = json.loads(Path(request["transformer"]).with_suffix(".json").read_text())["config"]
    kwargs = dict(patch_size=config["patch_size"], in_channels=config["in_channels"],
                  out_channels=config["out_channels"], num_layers=config["num_layers"],
                  attention_head_dim=config["attention_head_dim"], num_attention_heads=config["num_attention_heads"],
                  joint_attention_dim=config["joint_attention_dim"], axes_dims_rope=tuple(config["axes_dims_rope"]),
                  dtype=torch.float32, operations=comfy.ops.manual_cast)
    if "default_ref_method" in inspect.signature(qwen_model.QwenImageTransformer2DModel.__init__).parameters:
        kwargs["default_ref_method"] = ref_method or "index"
    model = qwen_model.QwenImageTransformer2DModel(**kwargs)
    result = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    same_keys = not result.missing_keys and not result.unexpected_keys

    # ComfyUI's key map for a Qwen-Image model (comfy/lora.py model_lora_keys_unet: names and class only).
    stub = object.__new__(comfy.model_base.QwenImage)
    object.__setattr__(stub, "state_dict", lambda: {f"diffusion_model.{k}": v for k, v in state.items()})
    object.__setattr__(stub, "model_config", types.SimpleNamespace(unet_config={"image_model": "qwen_image"}))
    key_map = comfy.lora.model_lora_keys_unet(stub, {})
    not_loaded: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: not_loaded.append(record.getMessage()) if "not loaded" in record.getMessage() else None
    logging.getLogger().addHandler(handler)
    patches = comfy.lora.load_lora(load_file(request["lora"]), key_map)
    print(json.dumps({"ref_method": ref_method, "same_keys": same_keys, "missing": result.missing_keys[:5],
                      "unexpected": result.unexpected_keys[:5], "patched": len(patches),
                      "lora_keys_not_loaded": len(not_loaded)}))


if __name__ == "__main__":
    main()
