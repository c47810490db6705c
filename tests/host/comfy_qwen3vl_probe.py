"""Record the state-dict names of ComfyUI's Qwen3-VL-8B text encoder module, the one ComfyUI's Qwen-Image 2.1 text
encoder (comfy/text_encoders/qwen_image21.py, newer than the ComfyUI snapshots here) builds on. Run with ComfyUI's
Python; ComfyUI 0.33.0's comfy/text_encoders/qwen3vl.py is the same module:

    /work/comfy/venv/bin/python tests/host/comfy_qwen3vl_probe.py /work/comfy/c033 tests/data/comfy_qwen3vl_8b_keys.json

Writes the names with layer and block indices as `#` (two language layers are built, on the meta device), the count
of tensors and the ComfyUI version. Nothing here imports this repository.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def main() -> None:
    comfy_root, out = sys.argv[1], Path(sys.argv[2])
    sys.path.insert(0, comfy_root)
    import torch

    from comfy.cli_args import args

    args.cpu = True
    import comfy.ops
    from comfy.text_encoders import qwen3vl

    model = qwen3vl._make_qwen3vl_model("qwen3vl_8b")({"num_hidden_layers": 2}, torch.bfloat16, "meta",
                                                        comfy.ops.manual_cast)
    names = list(model.state_dict())
    version = (Path(comfy_root) / "comfyui_version.py").read_text().split('"')[1]
    patterns = sorted({re.sub(r"\.\d+\.", ".#.", n) for n in names})
    out.write_text(json.dumps({"comfyui": version, "module": "comfy.text_encoders.qwen3vl qwen3vl_8b",
                               "tensors_with_2_layers": len(names), "patterns": patterns}, indent=1) + "\n")
    print(json.dumps({"patterns": len(patterns), "tensors": len(names)}))


if __name__ == "__main__":
    main()
