"""Run by tests/families/test_qwen_image_2512.py with ComfyUI's Python: which model ComfyUI's own detection picks for a
transformer file (comfy/model_detection.py, as comfy/sd.py load_diffusion_model does before building it).

    python comfy_detect_probe.py <comfyui checkout> <request.json>

request.json: {"files": {name: path of a transformer .safetensors}, "out": path of the JSON answer}.
The answer, per file: ComfyUI's detected unet config (its plain values) and the class of its supported model.
Nothing here imports this repository.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    comfy_root, request_file = sys.argv[1], sys.argv[2]
    sys.path.insert(0, comfy_root)
    from comfy.cli_args import args

    args.cpu = True  # as `main.py --cpu`: comfy.model_management reads it at import
    import comfy.model_detection
    import comfy.utils

    request = json.loads(Path(request_file).read_text())
    answer = {}
    for name, path in request["files"].items():
        state = comfy.utils.load_torch_file(path)
        config = comfy.model_detection.model_config_from_unet(state, "")
        answer[name] = {"model": type(config).__name__ if config is not None else None,
                        "unet_config": {k: v for k, v in (config.unet_config if config else {}).items()
                                        if isinstance(v, (int, str, float))}}
    Path(request["out"]).write_text(json.dumps(answer))
    print(json.dumps({"ok": sorted(answer)}))


if __name__ == "__main__":
    main()
