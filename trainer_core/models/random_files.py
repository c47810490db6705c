"""Large model files with random weights, written tensor by tensor: what the real-size rehearsals write instead of
the real files (devtools/random_files.py: Qwen-Image's; families/qwen_image21/random_files.py: Qwen-Image 2.1's).

Nothing is held whole: each tensor is made on `device` (normal values, std 0.02; norm weights 1), converted to the
file's dtype, copied to the CPU and appended to the file, so a 20 GB file needs one tensor of host RAM. One-byte
layouts: ComfyUI's scaled fp8 (`write_scaled_fp8_file`) and int8 ConvRot (`write_int8_convrot_file`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

SAFETENSORS_DTYPES = {torch.float8_e4m3fn: "F8_E4M3", torch.bfloat16: "BF16", torch.float32: "F32",
                      torch.float16: "F16", torch.int8: "I8", torch.uint8: "U8"}
STD = 0.02


def write_safetensors_streamed(path: str | Path, entries: list[tuple[str, tuple[int, ...], torch.dtype]],
                               make: Callable[[str], torch.Tensor] | None,
                               metadata: dict[str, str] | None = None) -> Path:
    """A safetensors file whose tensors `make(name)` returns one at a time, in `entries` order (name, shape,
    dtype: the header is written first, so each tensor must come back with exactly that shape and dtype).
    `make` None: the header only, and the data as a hole of the right size (a sparse file: no disk space,
    reads as zeros) for checks that read headers."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, shape, dtype in entries:
        size = dtype.itemsize
        for n in shape:
            size *= n
        header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        if make is None:
            f.truncate(8 + len(text) + offset)
            return path
        for name, shape, dtype in entries:
            tensor = make(name)
            if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
                raise ValueError(f"{name}: made {tuple(tensor.shape)} {tensor.dtype}, the header says {shape} {dtype}")
            data = tensor.detach().contiguous().to("cpu").reshape(-1).view(torch.uint8)
            if data.numel():
                f.write(memoryview(data.numpy()))
    return path


def _sidecar(path: Path, part: str, fmt: str, config: dict) -> None:
    path.with_suffix(".json").write_text(json.dumps({"part": part, "format": fmt, "config": config}, indent=2))


def _random(shape, device, generator, norm: bool) -> torch.Tensor:
    if norm:
        return torch.ones(shape, device=device)
    return torch.empty(shape, device=device).normal_(0.0, STD, generator=generator)


def write_scaled_fp8_file(path: str | Path, shapes: dict[str, tuple[int, ...]], linears: set[str],
                          comfyui_name: Callable[[str], str], seed: int = 0, device: str | torch.device = "cpu",
                          header_only: bool = False) -> Path:
    """A text encoder as ComfyUI's scaled-fp8 file (its Qwen2.5-VL's and Qwen3-VL's alike): the weight of every
    module in `linears` float8 with its fp32 `scale_weight` written right after it, every other tensor of `shapes`
    (our name -> shape) bf16, under `comfyui_name(our name)`, and the `scaled_fp8` marker last."""
    from .float8 import quantize_per_tensor
    from .layouts import SCALE_WEIGHT, SCALED_FP8_MARKER

    entries, sources = [], {}
    for name, shape in shapes.items():
        module, _, leaf = name.rpartition(".")
        if module in linears and leaf == "weight":
            entries.append((comfyui_name(name), shape, torch.float8_e4m3fn))
            entries.append((comfyui_name(module) + SCALE_WEIGHT, (), torch.float32))
            sources[comfyui_name(name)] = (name, shape, True)
        else:
            entries.append((comfyui_name(name), shape, torch.bfloat16))
            sources[comfyui_name(name)] = (name, shape, False)
    entries.append((SCALED_FP8_MARKER, (0,), torch.float8_e4m3fn))
    generator = torch.Generator(device=device).manual_seed(seed)
    pending: dict[str, torch.Tensor] = {}  # a weight's scale, made with it, written right after it

    def make(key: str) -> torch.Tensor:
        if key == SCALED_FP8_MARKER:
            return torch.empty(0, dtype=torch.float8_e4m3fn)
        if key in pending:
            return pending.pop(key)
        name, shape, quantized = sources[key]
        value = _random(shape, device, generator, norm="norm" in name and name.endswith(".weight"))
        if not quantized:
            return value.to(torch.bfloat16)
        weight, scale = quantize_per_tensor(value)
        pending[comfyui_name(name.rpartition(".")[0]) + SCALE_WEIGHT] = scale.float()
        return weight

    return write_safetensors_streamed(path, entries, None if header_only else make, {"format": "pt"})


def write_int8_convrot_file(path: str | Path, shapes: dict[str, tuple[int, ...]], linears: set[str],
                            comfyui_name: Callable[[str], str], seed: int = 0, group: int = 256) -> Path:
    """A model as ComfyUI's int8 ConvRot file (models/int8_convrot.py): the weight of every module in `linears` int8
    with its fp32 `weight_scale` (one per row) and its `comfy_quant` entry (rotated with `group` where the group divides
    its input features), every other tensor of `shapes` (our name -> shape) bf16, under `comfyui_name(our name)`.
    The codes are random (uniform int8) and the scales small: the rehearsal reads shapes and dtypes, not values, and
    rotating real-size random weights would take minutes for nothing."""
    from .int8_convrot import comfy_quant_entry

    entries, sources = [], {}
    for name, shape in shapes.items():
        module, _, leaf = name.rpartition(".")
        if module in linears and leaf == "weight":
            key = comfyui_name(module)
            entries.append((comfyui_name(name), shape, torch.int8))
            entries.append((key + ".weight_scale", (shape[0], 1), torch.float32))
            rotation = group if shape[1] % group == 0 else 0
            entries.append((key + ".comfy_quant", tuple(comfy_quant_entry(rotation).shape), torch.uint8))
            sources[comfyui_name(name)] = ("weight", shape)
            sources[key + ".weight_scale"] = ("scale", (shape[0], 1))
            sources[key + ".comfy_quant"] = ("quant", rotation)
        else:
            entries.append((comfyui_name(name), shape, torch.bfloat16))
            sources[comfyui_name(name)] = ("plain", shape)
    generator = torch.Generator().manual_seed(seed)

    def make(key: str) -> torch.Tensor:
        kind, what = sources[key]
        if kind == "weight":
            return torch.randint(-127, 128, what, generator=generator, dtype=torch.int8)
        if kind == "scale":
            return torch.full(what, STD / 64)
        if kind == "quant":
            return comfy_quant_entry(what)
        return _random(what, "cpu", generator, norm="norm" in key and key.endswith(".weight")).to(torch.bfloat16)

    return write_safetensors_streamed(path, entries, make, {"format": "pt"})
