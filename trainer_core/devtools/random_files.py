"""Model files in ComfyUI's layouts with random weights, at the real size or any config, written tensor by tensor.

For checks on a machine without the Qwen-Image files (benchmarks/gpu_check.py): what the loaders, the
memory plan and the swapper see is the files' layout, names, shapes and dtypes, never the values. Nothing
is held whole: each tensor is made on `device` (normal values, std 0.02; norm weights 1), converted to the
file's dtype, copied to the CPU and appended to the file, so the 20 GB transformer file needs one tensor of
host RAM. The layouts are those `models.part_files` writes from a live model:

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

from pathlib import Path

import torch
from torch import nn

from ..models.random_files import _random, _sidecar, write_safetensors_streamed, write_scaled_fp8_file

def write_random_transformer(path: str | Path, config: dict | None = None, device: str | torch.device = "cpu",
                             seed: int = 0, header_only: bool = False) -> Path:
    """The Qwen-Image transformer (`config`: diffusers' defaults = the real model) as an fp8_e4m3fn file
    (`header_only`: a sparse file, see `write_safetensors_streamed`)."""
    from ..models.float8 import FLOAT8, FLOAT8_MAX
    from ..models.streaming import empty_transformer
    from ..models.part_files import public_config

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


def write_vae(path: str | Path, config: dict | None = None, device: str | torch.device = "cpu", seed: int = 0) -> Path:
    """The Qwen-Image VAE (`config`: diffusers' defaults = the real one, 127M parameters) with diffusers' own
    initialisation, in ComfyUI's Wan 2.1 layout, bf16."""
    from diffusers import AutoencoderKLQwenImage

    from ..core.files import write_safetensors_atomic
    from ..models.vae_file import vae_file_tensors
    from ..models.part_files import public_config

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLQwenImage(**(config or {})).to(device)
    path = write_safetensors_atomic(vae_file_tensors(vae), path, {"format": "pt"})
    if config:
        _sidecar(Path(path), "vae", "bf16", public_config(vae.config))
    return Path(path)
