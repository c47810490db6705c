"""Run by tests/host/test_realsize_lora.py with ComfyUI's Python: ComfyUI's own key map for its REAL-size Qwen-Image
model, against our real-size LoRA files. No weight is built: ComfyUI detects the model from the file's tensor
names and shapes and builds it on the meta device.

    python comfy_realsize_lora_probe.py <comfyui checkout> <request.json>

request.json: {"shapes": path of a JSON {tensor name: shape} of the transformer file (no data needed),
               "loras": {name: path of a LoRA file}, "out": path of the JSON answer}.
The answer, per LoRA: its key count, the weights ComfyUI patches, the keys it does not load (what its
loader logs as "lora key not loaded"), patches whose up/down shapes do not compose to the patched weight's
shape, and the alphas it read. Nothing here imports this repository.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


def main() -> None:
    comfy_root, request_file = sys.argv[1], sys.argv[2]
    sys.path.insert(0, comfy_root)
    import torch
    from safetensors.torch import load_file

    from comfy.cli_args import args

    args.cpu = True  # as `main.py --cpu`: comfy.model_management reads it at import
    import comfy.lora
    import comfy.model_detection

    request = json.loads(Path(request_file).read_text())
    shapes = json.loads(Path(request["shapes"]).read_text())
    header = {name: torch.empty(shape, dtype=torch.bfloat16, device="meta") for name, shape in shapes.items()}
    # As comfy/sd.py load_diffusion_model_state_dict: detect the model, then build it (here on meta).
    model_config = comfy.model_detection.model_config_from_unet(header, "")
    if model_config is None:
        raise SystemExit("ComfyUI did not detect a model in these tensor names and shapes")
    model_config.set_inference_dtype(torch.bfloat16, None)
    model = model_config.get_model(header, "", device=torch.device("meta"))
    weights = model.state_dict()
    key_map = comfy.lora.model_lora_keys_unet(model, {})

    not_loaded: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: not_loaded.append(record.getMessage()) if "not loaded" in record.getMessage() else None
    logging.getLogger().addHandler(handler)
    answer = {"model": type(model).__name__, "unet_config": {k: v for k, v in model_config.unet_config.items()
                                                            if isinstance(v, (int, str, float))},
              "blocks": len(model.diffusion_model.transformer_blocks), "loras": {}}
    for name, path in request["loras"].items():
        lora = load_file(path)
        not_loaded.clear()
        patches = comfy.lora.load_lora(lora, key_map)
        bad, alphas = [], set()
        for key, adapter in patches.items():
            up, down, alpha = adapter.weights[:3]
            shape = tuple(weights[key].shape)
            if (up.shape[0], down.shape[1]) != shape or up.shape[1] != down.shape[0]:
                bad.append(f"{key}: up {tuple(up.shape)}, down {tuple(down.shape)}, weight {shape}")
            alphas.add(None if alpha is None else float(alpha))
        answer["loras"][name] = {"keys": len(lora), "patched": sorted(patches), "not_loaded": list(not_loaded),
                                 "bad_shapes": bad, "alphas": sorted(alphas, key=str)}
    Path(request["out"]).write_text(json.dumps(answer))
    print(json.dumps({"ok": sorted(answer["loras"])}))


if __name__ == "__main__":
    main()
