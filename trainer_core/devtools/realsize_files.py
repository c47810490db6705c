"""Random-weight files with the exact shapes, dtypes and key layouts of ComfyUI's real Qwen-Image files.

    diffusion_models/qwen_image_fp8_e4m3fn.safetensors   20.4 GB: diffusers names, bare; every Linear weight
                                                          float8_e4m3fn, every other tensor bf16
    text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors   9.4 GB: ComfyUI's names (`model.layers.*`,
                                                          `visual.*`, `lm_head`), every Linear weight of the
                                                          language model and the vision tower float8 with an
                                                          fp32 `scale_weight`, the `scaled_fp8` marker
    vae/qwen_image_vae.safetensors                        254 MB: the Wan 2.1 layout, bf16

For rehearsing the real size where the real files cannot be downloaded (benchmarks/realsize_cpu.py,
benchmarks/gpu_check.py). Shapes come from the real configs: diffusers' `QwenImageTransformer2DModel` and
`AutoencoderKLQwenImage` defaults, `qwen_arch.QWEN25_VL_7B_CONFIG`, all built on the meta device; names and
dtypes follow the rules our loaders read and our exporters write (`*_file_tensors`), checked on tiny files
against ComfyUI itself (tests/test_host_files.py).

Writing streams: the header is computed from the shapes, then each tensor's bytes are written from a small
pool of random values, so writing 30 GB needs about 100 MB of memory. Values are plausible for a forward
pass: weights ~ N(0, 0.02), norm scales 1, biases 0 (random norm scales and biases would not change memory
or time, but could overflow bf16 over 60 blocks).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from ..models.layouts import SCALE_WEIGHT, SCALED_FP8_MARKER
from ..models.safetensors_file import _DTYPES
from ..models.streaming import empty_transformer

# torch dtype -> safetensors' header name
ST_NAME = {dtype: name for name, dtype in _DTYPES.items()}
POOL_BYTES = 32 << 20
WEIGHT_STD = 0.02
FILE_NAMES = {
    "transformer": "diffusion_models/qwen_image_fp8_e4m3fn.safetensors",
    "text_encoder": "text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors",
    "vae": "vae/qwen_image_vae.safetensors",
}

Spec = tuple[tuple[int, ...], torch.dtype]


def _linear_weights(model: nn.Module, skip: tuple[str, ...] = ()) -> set[str]:
    return {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Linear) and name not in skip}


def transformer_specs() -> dict[str, Spec]:
    """ComfyUI's qwen_image_fp8_e4m3fn: every Linear weight float8, everything else bf16, bare names."""
    model = empty_transformer({})
    linears = _linear_weights(model)
    return {name: (tuple(p.shape), torch.float8_e4m3fn if name in linears else torch.bfloat16)
            for name, p in model.named_parameters()}


def text_encoder_specs() -> dict[str, Spec]:
    """ComfyUI's qwen_2.5_vl_7b_fp8_scaled: language model, vision tower and lm_head under ComfyUI's names."""
    from accelerate import init_empty_weights
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from ..models.qwen_arch import QWEN25_VL_7B_CONFIG
    from ..models.text_encoder_file import comfyui_name

    with init_empty_weights(include_buffers=False):
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig.from_dict(QWEN25_VL_7B_CONFIG))
    linears = _linear_weights(model, skip=("lm_head",))  # lm_head is not one of ComfyUI's scaled Linears
    specs: dict[str, Spec] = {}
    for name, p in model.named_parameters():
        if name in linears:
            specs[comfyui_name(name)] = (tuple(p.shape), torch.float8_e4m3fn)
            specs[comfyui_name(name[: -len(".weight")]) + SCALE_WEIGHT] = ((), torch.float32)
        else:
            specs[comfyui_name(name)] = (tuple(p.shape), torch.bfloat16)
    specs[SCALED_FP8_MARKER] = ((0,), torch.float8_e4m3fn)
    return specs


def vae_specs() -> dict[str, Spec]:
    """ComfyUI's qwen_image_vae: the Wan 2.1 names, bf16."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKLQwenImage

    from ..models.vae_file import diffusers_to_wan_name

    with init_empty_weights(include_buffers=False):
        vae = AutoencoderKLQwenImage()
    blocks = vae.config.num_res_blocks
    return {diffusers_to_wan_name(name, blocks): (tuple(p.shape), torch.bfloat16) for name, p in vae.named_parameters()}


SPECS = {"transformer": transformer_specs, "text_encoder": text_encoder_specs, "vae": vae_specs}


def file_bytes(specs: dict[str, Spec]) -> int:
    return sum(_nbytes(shape, dtype) for shape, dtype in specs.values())


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * dtype.itemsize


def _kind(name: str) -> str:
    leaf = name.rpartition(".")[2]
    if name.endswith(SCALE_WEIGHT):
        return "scale"
    if leaf == "bias":
        return "zeros"
    if leaf == "gamma" or ("norm" in name and leaf == "weight"):
        return "ones"
    return "normal"


class _Pools:
    """Per (dtype, kind) a buffer of values whose bytes are written, from a rotating offset, for every tensor."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)
        self.pools: dict[tuple[torch.dtype, str], bytes] = {}

    def get(self, dtype: torch.dtype, kind: str, scaled: bool) -> bytes:
        key = (dtype, kind + ("-scaled" if scaled else ""))
        if key not in self.pools:
            n = POOL_BYTES // dtype.itemsize if kind == "normal" else 4096
            if kind == "normal":
                # A scaled-fp8 weight stores values ~ N(0, 1); its scale brings them to N(0, WEIGHT_STD).
                values = torch.randn(n, generator=self.generator) * (1.0 if scaled else WEIGHT_STD)
            else:
                values = torch.full((n,), {"ones": 1.0, "zeros": 0.0, "scale": WEIGHT_STD}[kind])
            self.pools[key] = values.to(dtype).view(torch.uint8).numpy().tobytes()
        return self.pools[key]


def write_random_file(path: str | Path, specs: dict[str, Spec], seed: int = 0,
                      metadata: dict[str, str] | None = None) -> Path:
    """A valid safetensors file with `specs`' names, shapes and dtypes and random values (see module doc),
    written through a temporary file and renamed, so a killed write leaves no file that looks complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    names = sorted(specs)
    for name in names:
        shape, dtype = specs[name]
        size = _nbytes(shape, dtype)
        header[name] = {"dtype": ST_NAME[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
    scaled = SCALED_FP8_MARKER in specs
    pools = _Pools(seed)
    temp = path.with_name(path.name + ".part")
    with open(temp, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for n, name in enumerate(names):
            shape, dtype = specs[name]
            pool = pools.get(dtype, _kind(name), scaled and dtype == torch.float8_e4m3fn)
            remaining = _nbytes(shape, dtype)
            start = (n * 7919 * dtype.itemsize) % len(pool)  # each tensor starts elsewhere in the pool
            start -= start % dtype.itemsize
            while remaining:
                piece = memoryview(pool)[start:start + remaining]
                f.write(piece)
                remaining -= len(piece)
                start = 0
    os.replace(temp, path)
    return path


def write_realsize_files(folder: str | Path, seed: int = 0, log=print) -> dict[str, Path]:
    """The three files under `folder` (ComfyUI's models/ sub-folders); files already there are kept."""
    folder = Path(folder)
    out = {}
    for n, (part, relative) in enumerate(FILE_NAMES.items()):
        path = folder / relative
        if not path.is_file():
            specs = SPECS[part]()
            log(f"writing {path} ({file_bytes(specs) / 2**30:.1f} GiB)")
            write_random_file(path, specs, seed=seed + n)
        out[part] = path
    return out
