"""Run by tests/host/test_host_qwen_image21.py with ComfyUI's Python in a ComfyUI that runs Qwen-Image 2.1: load our 2.1
transformer files through ComfyUI's UNETLoader node and our 2.1 LoRA files through its LoraLoaderModelOnly node,
then run ComfyUI's 2.1 transformer (comfy/ldm/qwen_image21/model.py) with the LoRA patched in as sampling patches it
(comfy.model_management.load_models_gpu, on the CPU).

    python comfy_qwen21_probe.py <comfyui checkout> <request.json>

request.json: {"models": {name: path of a 2.1 transformer file}, "loras": {name: path of a LoRA file},
               "inputs": a .safetensors of x (B, C, H, W) / timestep (B,) in [0, 1] / context (B, L, D),
               "weights_of": {model name: ["base" and / or LoRA names whose block Linear weights to return]},
               "out": path of the answer (.safetensors; the JSON report beside it, same name + .json)}.
Writes, per model file M: `forward.M.base` (no LoRA) and per LoRA file N `forward.M.N` (ComfyUI's output with it,
fp32 activations); as weights_of asks, `weight.M.base.<name>` and `weight.M.N.<name>`: each block Linear's weight as
ComfyUI holds it while it runs (patched, dequantised to fp32 where it is int8). The JSON report, per model: ComfyUI's
detected model class and unet config, the kinds of its block Linear weights as loaded and as patched, and per LoRA
the messages of keys ComfyUI did not load ("lora key not loaded" from comfy/lora.py, "NOT LOADED" from comfy/sd.py)
and how many weights it patched. Nothing here imports this repository.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path


def main() -> None:
    comfy_root, request_file = sys.argv[1], sys.argv[2]
    sys.path.insert(0, comfy_root)
    import torch
    from safetensors.torch import load_file, save_file

    from comfy.cli_args import args

    # as `main.py --cpu --use-pytorch-cross-attention`: comfy.model_management and attention read these at import.
    # PyTorch's attention, because ComfyUI's CPU default (sub-quadratic) adds a boolean mask as a +1 bias.
    args.cpu = True
    args.use_pytorch_cross_attention = True
    import comfy.model_management
    import folder_paths
    import nodes

    request = json.loads(Path(request_file).read_text())
    inputs = load_file(request["inputs"])

    # The nodes find files by name in ComfyUI's model folders: a private folder for each kind, as a user's would be.
    root = Path(tempfile.mkdtemp(prefix="qwen21_probe_"))
    for kind, files in (("diffusion_models", request["models"]), ("loras", request["loras"])):
        (root / kind).mkdir()
        folder_paths.add_model_folder_path(kind, str(root / kind), is_default=True)
        for name, path in files.items():
            (root / kind / f"{name}.safetensors").symlink_to(Path(path).resolve())

    out: dict = {}  # the tensors of the answer
    report: dict = {}  # its JSON
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger().addHandler(handler)

    def block_weights(diffusion_model, key: str | None) -> dict[str, str]:
        """Each distinct kind of the block Linears' weights (type, dtype, quantised layout, ConvRot group) with a
        count; with `key`, each weight's values (dequantised, fp32) go into `out` as `weight.<key>.<name>`."""
        kinds: dict[str, int] = {}
        for name, module in diffusion_model.transformer_blocks.named_modules(prefix="transformer_blocks"):
            weight = getattr(module, "weight", None)
            if weight is None or weight.dim() != 2:
                continue
            params = getattr(weight, "_params", None)
            kind = (f"{type(weight).__name__} {weight.dtype} {getattr(weight, '_layout_cls', None)} "
                    f"convrot={getattr(params, 'convrot_groupsize', 0) if getattr(params, 'convrot', False) else 0}")
            kinds[kind] = kinds.get(kind, 0) + 1
            if key is not None:
                values = weight.dequantize() if getattr(weight, "_layout_cls", None) else weight  # comfy-kitchen's
                out[f"weight.{key}.{name}.weight"] = values.detach().float().clone()
        return {k: str(v) for k, v in kinds.items()}

    @torch.no_grad()
    def forward(patcher, key: str, dump: bool) -> dict[str, str]:
        # What sampling does before each run: load (and patch) the model on its device, here the CPU.
        comfy.model_management.load_models_gpu([patcher], force_full_load=True)
        model = patcher.model.diffusion_model
        x, timestep, context = inputs["x"], inputs["timestep"], inputs["context"]
        out[f"forward.{key}"] = model(x, timestep, context, transformer_options={}).float()
        weights = block_weights(model, key if dump else None)
        comfy.model_management.unload_all_models()  # unpatches: the next LoRA starts from the file's weights
        return weights

    try:
        for model_name in request["models"]:
            (base,) = nodes.UNETLoader().load_unet(f"{model_name}.safetensors", "default")
            entry = report[model_name] = {
                "model": type(base.model).__name__,
                "unet_config": {k: v for k, v in base.model.model_config.unet_config.items()
                                if isinstance(v, (bool, int, str, float))},
                "dtype": str(base.model.get_dtype()), "manual_cast": str(base.model.manual_cast_dtype),
                "loras": {},
            }
            dump = request.get("weights_of", {}).get(model_name, ())
            entry["weights"] = forward(base, f"{model_name}.base", "base" in dump)
            for lora_name in request["loras"]:
                messages.clear()
                (patched,) = nodes.LoraLoaderModelOnly().load_lora_model_only(base, f"{lora_name}.safetensors", 1.0)
                not_loaded = [m for m in messages if "lora key not loaded" in m or "NOT LOADED" in m]
                weights = forward(patched, f"{model_name}.{lora_name}", lora_name in dump)
                entry["loras"][lora_name] = {"not_loaded": not_loaded, "patched": len(patched.patches),
                                             "weights": weights}
    finally:
        shutil.rmtree(root)
    save_file({k: v.contiguous() for k, v in out.items()}, request["out"])
    Path(request["out"] + ".json").write_text(json.dumps(report, indent=1))
    print(json.dumps({"ok": sorted(out)}))


if __name__ == "__main__":
    main()
