"""Qwen-Image 2.1's model files with random weights at the real size, in the layouts our 2.1 loaders read
(this package), written tensor by tensor (`random_files.write_safetensors_streamed`): for the CPU
rehearsal (benchmarks/realsize_cpu.py --model qwen-image-2.1). What the loaders and the memory plan see is the
files' names, shapes and dtypes, never the values.

    transformer   ComfyUI's layout (files.py): `model.diffusion_model.` + diffusers' names, the MLP fused as
                  `img_mlp.gate_up`, every block Linear weight float8 (fp8_e4m3fn), the rest bf16; the real
                  config (32 blocks of width 4096), or `num_layers` real-width blocks
    text encoder  ComfyUI's Qwen3-VL-8B layout (text_file.py: `model.*`, `visual.*`, `model.lm_head`), every Linear
                  of the language layers and the vision blocks float8 with its fp32 `scale_weight` and the
                  `scaled_fp8` marker, the rest bf16 (about 10.5 GB); or those Linears int8 ConvRot
    (either part `fmt="int8_convrot"`: ComfyUI's int8 layers, random codes, as the 2.1 templates' files)
    VAE           ComfyUI's 2.1 VAE layout (vae_file.py), bf16, built as a live model (diffusers' init) and
                  written at once
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ...models.random_files import (
    _random,
    _sidecar,
    write_int8_convrot_file,
    write_safetensors_streamed,
    write_scaled_fp8_file,
)


def write_random_transformer21(path: str | Path, num_layers: int | None = None, seed: int = 0,
                               fmt: str = "fp8_e4m3fn") -> Path:
    """The 2.1 transformer (diffusers' defaults = the real model; `num_layers` real-width blocks) as ComfyUI's
    fp8_e4m3fn file with the MLP fused, or (`fmt` "int8_convrot") as its int8 ConvRot file, the block Linears int8
    (the file ComfyUI's 2.1 templates download)."""
    from .files import empty_transformer21
    from ...models.float8 import FLOAT8, FLOAT8_MAX
    from .arch import FUSED_MLP, FUSED_PARTS
    from ...models.part_files import public_config

    model = empty_transformer21({} if num_layers is None else {"num_layers": num_layers})
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith("transformer_blocks.")}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, t in model.state_dict().items():
        if f".{FUSED_PARTS[1]}." in name:
            continue  # written within gate_up
        if f".{FUSED_PARTS[0]}." in name:
            shapes[name.replace(FUSED_PARTS[0], FUSED_MLP)] = (2 * t.shape[0], *t.shape[1:])  # [gate; up]
        else:
            shapes[name] = tuple(t.shape)
    fused_linears = linears | {n.replace(FUSED_PARTS[0], FUSED_MLP) for n in linears}
    kinds = {n: FLOAT8 if n.rpartition(".")[0] in fused_linears and n.endswith(".weight") else torch.bfloat16
             for n in shapes}
    prefix = "model.diffusion_model."
    if fmt == "int8_convrot":
        path = write_int8_convrot_file(path, shapes, fused_linears, lambda n: prefix + n, seed)
        if num_layers is not None:
            _sidecar(path, "transformer", fmt, public_config(model.config))
        return path
    generator = torch.Generator().manual_seed(seed)

    def make(key: str) -> torch.Tensor:
        name = key[len(prefix):]
        value = _random(shapes[name], "cpu", generator, norm="norm" in name and name.endswith(".weight"))
        return value.clamp(-FLOAT8_MAX, FLOAT8_MAX).to(FLOAT8) if kinds[name] == FLOAT8 else value.to(torch.bfloat16)

    path = write_safetensors_streamed(path, [(prefix + n, shapes[n], kinds[n]) for n in shapes], make,
                                      {"format": "pt"})
    if num_layers is not None:
        _sidecar(path, "transformer", "fp8_e4m3fn", public_config(model.config))
    return path


def write_random_qwen3_vl(path: str | Path, seed: int = 0, config: dict | None = None, fmt: str = "fp8_scaled") -> Path:
    """Qwen3-VL-8B (arch.QWEN3_VL_8B_CONFIG; or `config`, with its JSON beside the file) as
    ComfyUI's scaled-fp8 text encoder file, or (`fmt` "int8_convrot") as its int8 ConvRot one
    (`qwen3vl_8b_int8_convrot`, what ComfyUI's 2.1 templates download)."""
    from .text_file import comfyui_name, empty_qwen3_vl
    from .arch import QWEN3_VL_8B_CONFIG

    model = empty_qwen3_vl(config or QWEN3_VL_8B_CONFIG)
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)
               and (".layers." in n or n.startswith("model.visual.blocks."))}
    text = model.config.text_config
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    shapes["lm_head.weight"] = (text.vocab_size, text.hidden_size)  # in ComfyUI's file; not loaded
    if fmt == "int8_convrot":
        path = write_int8_convrot_file(path, shapes, linears, comfyui_name, seed)
    else:
        path = write_scaled_fp8_file(path, shapes, linears, comfyui_name, seed)
    if config:
        _sidecar(path, "text encoder", fmt, model.config.to_dict())
    return path


def write_vae21(path: str | Path, seed: int = 0) -> Path:
    """The real 2.1 VAE (diffusers' defaults, diffusers' own initialisation) in ComfyUI's 2.1 layout, bf16."""
    from diffusers import AutoencoderKLQwenImage21

    from ...core.files import write_safetensors_atomic
    from .vae_file import comfyui_vae_tensors

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLQwenImage21()
    return Path(write_safetensors_atomic(comfyui_vae_tensors(vae), path, {"format": "pt"}))
