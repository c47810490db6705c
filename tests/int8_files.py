"""int8 files as ComfyUI writes them, made by comfy-kitchen (ComfyUI's own quantisation library): the oracle writer
of the int8 tests, never the pack's own quantiser.

ComfyUI saves a quantised Linear through comfy/ops.py `_quantized_weight_state_dict`: comfy-kitchen's
`QuantizedTensor.state_dict("P.weight")` (for `TensorWiseINT8Layout`: `P.weight` int8 and `P.weight_scale`), plus
`P.comfy_quant`, the UTF-8 JSON {"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": G} as 1-D uint8
(no "convrot" keys for a layer quantised without the rotation). ComfyUI's converter rotates a layer whose input
features the group divides and quantises the others as plain per-row int8 (DESIGN.md section 12); so does this.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

INT8_FORMAT = "int8_tensorwise"


def kitchen_quantize(weight: torch.Tensor, group: int):
    """comfy-kitchen's QuantizedTensor of `weight` (out, in): rotated with `group` when it divides the input
    features (0: never), one scale per row."""
    from comfy_kitchen.tensor import QuantizedTensor

    rotate = bool(group) and weight.shape[1] % group == 0
    return QuantizedTensor.from_float(weight.float(), "TensorWiseINT8Layout", is_weight=True, per_channel=True,
                                      convrot=rotate, convrot_groupsize=group or 256), rotate


def comfy_quant(config: dict) -> torch.Tensor:
    return torch.tensor(list(json.dumps(config).encode("utf-8")), dtype=torch.uint8)


def to_int8(tensors: dict[str, torch.Tensor], quantised: Callable[[str], bool], group: int = 16,
            nested: bool = False) -> dict[str, torch.Tensor]:
    """`tensors` (a file's, keys as stored) with every 2-D `<P>.weight` for which `quantised(key)` holds written as
    ComfyUI's int8 layer. `nested`: the rotation keys inside "params" (the other spelling ComfyUI reads)."""
    out = {}
    for key, tensor in tensors.items():
        if not (key.endswith(".weight") and tensor.dim() == 2 and quantised(key)):
            out[key] = tensor
            continue
        layer = key[: -len("weight")]
        qt, rotated = kitchen_quantize(tensor, group)
        out.update(qt.state_dict(f"{layer}weight"))
        rotation = {"convrot": True, "convrot_groupsize": group} if rotated else {}
        out[f"{layer}comfy_quant"] = comfy_quant({"format": INT8_FORMAT,
                                                  **({"params": rotation} if nested and rotation else rotation)})
    return out


def kitchen_dequantized(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every int8 layer of a file's `tensors` dequantised by comfy-kitchen (float32), keyed by its weight's key."""
    from comfy_kitchen.tensor import QuantizedTensor
    from comfy_kitchen.tensor.int8 import TensorWiseINT8Layout

    out = {}
    for key, raw in tensors.items():
        if not key.endswith(".comfy_quant"):
            continue
        layer = key[: -len("comfy_quant")]
        config = json.loads(bytes(raw.tolist()).decode())
        rotation = config.get("params", config)
        params = TensorWiseINT8Layout.Params(scale=tensors[f"{layer}weight_scale"], orig_dtype=torch.float32,
                                             orig_shape=tuple(tensors[f"{layer}weight"].shape), is_weight=True,
                                             convrot=bool(rotation.get("convrot")),
                                             convrot_groupsize=int(rotation.get("convrot_groupsize", 256)))
        out[f"{layer}weight"] = QuantizedTensor(tensors[f"{layer}weight"], "TensorWiseINT8Layout", params).dequantize()
    return out


def int8_copy(path: Path, target: Path, quantised: Callable[[str], bool], group: int = 16) -> Path:
    """A copy of the safetensors file `path` (and the config JSON beside it) at `target` with its Linear weights that
    `quantised` picks written as ComfyUI's int8 layers by comfy-kitchen."""
    from safetensors.torch import load_file, save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(path))
    save_file({k: v.contiguous() for k, v in to_int8(tensors, quantised, group).items()}, str(target))
    sidecar = path.with_suffix(".json")
    if sidecar.is_file():
        target.with_suffix(".json").write_text(sidecar.read_text())
    return target


def linear_weights_of(model: torch.nn.Module, prefix: str = "", skip=()) -> set[str]:
    """The file keys (`prefix` + name) of every nn.Linear weight of `model`, but those whose name contains one of
    `skip`."""
    return {f"{prefix}{name}.weight" for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and not any(s in name for s in skip)}


# ComfyUI's other layouts (comfy/quant_ops.py QUANT_ALGOS), by the `comfy_quant` format a layer names -> (comfy-kitchen's
# layout class, its quantiser's arguments, the JSON ComfyUI writes beside the layer). awq_w4a16 needs calibration
# comfy-kitchen does not do offline: its layer is written in its stored shapes (int8 codes, scales and zeros).
KITCHEN_LAYOUTS = {
    "float8_e4m3fn": ("TensorCoreFP8Layout", {}, {"format": "float8_e4m3fn"}),
    "nvfp4": ("TensorCoreNVFP4Layout", {}, {"format": "nvfp4"}),
    "mxfp8": ("TensorCoreMXFP8Layout", {}, {"format": "mxfp8"}),
    "convrot_w4a4": ("TensorCoreConvRotW4A4Layout", {"convrot_groupsize": 16},
                     {"format": "convrot_w4a4", "convrot_groupsize": 16}),
    "asym_w4a8_int8": ("AsymW4A8Int8Layout", {"group_size": 16, "convrot_groupsize": 16},
                       {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 16}),
    "awq_w4a16": (None, {}, {"format": "awq_w4a16", "group_size": 64}),
}


def kitchen_layer(key: str, weight: torch.Tensor, fmt: str) -> dict[str, torch.Tensor]:
    """The tensors of ComfyUI's layer `key` (`<P>.weight`) quantised as `fmt` (KITCHEN_LAYOUTS) by comfy-kitchen, with
    its `comfy_quant` entry."""
    from comfy_kitchen.tensor import QuantizedTensor

    layout, params, config = KITCHEN_LAYOUTS[fmt]
    layer = key[: -len("weight")]
    if layout is None:  # awq_w4a16: 4-bit codes packed two a byte, a scale and a zero per group of 64 inputs
        out, k = weight.shape
        tensors = {key: torch.zeros(out, k // 2, dtype=torch.int8),
                   f"{layer}weight_scale": torch.ones(out, max(1, k // 64), dtype=torch.float16),
                   f"{layer}weight_zero": torch.zeros(out, max(1, k // 64), dtype=torch.float16)}
    else:
        tensors = QuantizedTensor.from_float(weight.float(), layout, **params).state_dict(key)
    return {**{k: v.contiguous() for k, v in tensors.items()}, f"{layer}comfy_quant": comfy_quant(config)}
