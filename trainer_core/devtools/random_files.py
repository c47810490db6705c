"""Model files in ComfyUI's layouts with random weights, at the real size or any config, written tensor by tensor.

For checks on a machine without the Qwen-Image files (benchmarks/gpu_check.py): what the loaders, the
memory plan and the swapper see is the files' layout, names, shapes and dtypes, never the values. Nothing
is held whole: each tensor is made on `device` (normal values, std 0.02; norm weights 1), converted to the
file's dtype, copied to the CPU and appended to the file, so the 20 GB transformer file needs one tensor of
host RAM. The layouts are those `devtools.export` writes from a live model:

    transformer   fp8_e4m3fn: bare diffusers names, every Linear weight float8, the rest bf16
    text encoder  fp8_scaled: ComfyUI's names (`model.layers.*`), the language model only, every decoder
                  Linear weight float8 with its fp32 `scale_weight`, the `scaled_fp8` marker, the rest bf16;
                  `whole=True`: the whole file as ComfyUI ships it (9.38 GB at the real size), with the vision
                  tower (`visual.*`, its Linears float8 + scale too) and `lm_head` (bf16)
    VAE           ComfyUI's Wan 2.1 names, bf16 (small: built as a live model and written at once)

A config JSON (`{"part", "format", "config"}`) is written beside a file whose config is not the real model's,
as `export-tiny` does, because the loaders take only the real model's config from shapes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

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


def write_random_transformer(path: str | Path, config: dict | None = None, device: str | torch.device = "cpu",
                             seed: int = 0, header_only: bool = False) -> Path:
    """The Qwen-Image transformer (`config`: diffusers' defaults = the real model) as an fp8_e4m3fn file
    (`header_only`: a sparse file, see `write_safetensors_streamed`)."""
    from ..models.float8 import FLOAT8, FLOAT8_MAX
    from ..models.streaming import empty_transformer
    from .export import public_config

    model = empty_transformer(config or {})
    linears = {name for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    kinds = {name: FLOAT8 if name.rpartition(".")[0] in linears and name.endswith(".weight") else torch.bfloat16
             for name in shapes}
    generator = torch.Generator(device=device).manual_seed(seed)

    def make(name: str) -> torch.Tensor:
        value = _random(shapes[name], device, generator, norm="norm" in name and name.endswith(".weight"))
        if kinds[name] == FLOAT8:
            return value.clamp(-FLOAT8_MAX, FLOAT8_MAX).to(FLOAT8)
        return value.to(torch.bfloat16)

    path = write_safetensors_streamed(path, [(n, shapes[n], kinds[n]) for n in shapes], None if header_only else make,
                                      {"format": "pt"})
    if config:
        _sidecar(path, "transformer", "fp8_e4m3fn", public_config(model.config))
    return path


def write_random_text_encoder(path: str | Path, config: dict | None = None, device: str | torch.device = "cpu",
                              seed: int = 0, header_only: bool = False, whole: bool = False) -> Path:
    """Qwen2.5-VL's language model (`config`: a Qwen2_5_VLConfig dict; default the real 7B) as ComfyUI's
    fp8_scaled text encoder file; `whole`: with the vision tower and `lm_head`, as ComfyUI's file is."""
    from ..models.qwen_arch import QWEN25_VL_7B_CONFIG
    from ..models.text_encoder_file import comfyui_name, empty_text_encoder

    model = empty_text_encoder(config or QWEN25_VL_7B_CONFIG, vision=whole)
    linears = {name for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and (".layers." in f".{name}" or name.startswith("model.visual."))}
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if whole:  # not loaded by us (Qwen-Image reads hidden states), but in ComfyUI's file
        shapes["lm_head.weight"] = (model.config.text_config.vocab_size, model.config.text_config.hidden_size)
    path = write_scaled_fp8_file(path, shapes, linears, comfyui_name, seed, device, header_only)
    if config:
        _sidecar(path, "text encoder", "fp8_scaled", model.config.to_dict())
    return path


def write_scaled_fp8_file(path: str | Path, shapes: dict[str, tuple[int, ...]], linears: set[str],
                          comfyui_name: Callable[[str], str], seed: int = 0, device: str | torch.device = "cpu",
                          header_only: bool = False) -> Path:
    """A text encoder as ComfyUI's scaled-fp8 file (its Qwen2.5-VL's and Qwen3-VL's alike): the weight of every
    module in `linears` float8 with its fp32 `scale_weight` written right after it, every other tensor of `shapes`
    (our name -> shape) bf16, under `comfyui_name(our name)`, and the `scaled_fp8` marker last."""
    from ..models.float8 import quantize_per_tensor
    from ..models.layouts import SCALE_WEIGHT, SCALED_FP8_MARKER

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
    from ..models.int8_convrot import comfy_quant_entry

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


def write_vae(path: str | Path, config: dict | None = None, device: str | torch.device = "cpu", seed: int = 0) -> Path:
    """The Qwen-Image VAE (`config`: diffusers' defaults = the real one, 127M parameters) with diffusers' own
    initialisation, in ComfyUI's Wan 2.1 layout, bf16."""
    from diffusers import AutoencoderKLQwenImage

    from ..core.files import write_safetensors_atomic
    from ..models.vae_file import vae_file_tensors
    from .export import public_config

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLQwenImage(**(config or {})).to(device)
    path = write_safetensors_atomic(vae_file_tensors(vae), path, {"format": "pt"})
    if config:
        _sidecar(Path(path), "vae", "bf16", public_config(vae.config))
    return Path(path)
