"""Qwen-Image 2.1's files: ComfyUI's single transformer file (either MLP layout, bf16 or float8) and diffusers folders.

ComfyUI layout of the transformer (evidence, not verified against ComfyUI's own `comfy/ldm/qwen_image21/`,
which no snapshot here holds): diffusers' module names under `model.diffusion_model.` (or another prefix of
`layouts.TRANSFORMER_PREFIXES`), the SwiGLU's gate and up projections either split (`img_mlp.gate_layer`,
`img_mlp.proj`, diffusers' names) or fused as `img_mlp.gate_up` with the gate's rows first; diffusers
0.42.1's own `convert_qwen_image21_transformer_checkpoint_to_diffusers` reads ComfyUI's files that way and
the tests check our reader against it. Float8 files may be plain float8 or ComfyUI's scaled float8
(`layouts.split_scaled_fp8`: a fused weight's one scale serves both halves); int8 files ComfyUI's int8 layers
(`qwen_image_2.1_int8_convrot`, `_turbo_int8_convrot`: models/int8_convrot.py, one scale per row, so a fused
weight's scale rows split with its weight rows; the rotation acts on the input features, which both halves share).

The config comes from the shapes (blocks, widths, channels, MLP ratio); RoPE axes from the JSON beside the
file, else the real model's (16, 56, 56) when the head size is 128. Reading streams tensor by tensor onto an
empty model (`models.streaming.stream_into`), so the block Linears are stored as `storage` asks with no
full bf16 copy, and swapped blocks' weights go straight to host memory, as for Qwen-Image.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from ...core.errors import UserInputError
from ...models.float8 import FLOAT8, FLOAT8_MAX, dequantized_state_dict, frozen_linears, quantize_per_tensor
from ...models.layouts import (
    SCALE_WEIGHT,
    SCALED_FP8_MARKER,
    TRANSFORMER_PREFIXES,
    find_prefix,
    int8_weights,
    refuse_nonfinite_scales,
    runtime_note,
    split_scaled_fp8,
    strip_prefix,
)
from .arch import FUSED_MLP, FUSED_PARTS, TRANSFORMER_PROBE
from ...models.qwen_arch import BLOCKS
from ...models.safetensors_file import SafetensorsFile
from ...models.streaming import stream_into

REAL_AXES_DIMS_ROPE = (16, 56, 56)  # diffusers' default = the published config (head size 128)
MLP_LAYOUTS = ("fused", "split")
_BLOCK = re.compile(BLOCKS + r"\.(\d+)\.")
_CHOOSE = "Choose a Qwen-Image 2.1 transformer file (ComfyUI folder models/diffusion_models)."


def empty_transformer21(config: dict) -> nn.Module:
    from accelerate import init_empty_weights
    from diffusers import QwenImage21Transformer2DModel

    with init_empty_weights(include_buffers=False):
        return QwenImage21Transformer2DModel.from_config(config)


def split_names(names) -> dict[str, tuple[str, int | None]]:
    """Our name -> (the file's name, which half of a fused `gate_up` it is: 0 gate, 1 up, or None)."""
    out = {}
    for name in names:
        if f".{FUSED_MLP}." in name:
            for half, part in enumerate(FUSED_PARTS):
                out[name.replace(FUSED_MLP, part)] = (name, half)
        else:
            out[name] = (name, None)
    return out


def config_from_shapes(shapes: dict[str, tuple[int, ...]], sidecar: dict | None, source: str) -> dict:
    needed = ("img_in.weight", "txt_in.in_layer.weight", "proj_out.weight", f"{BLOCKS}.0.attn.norm_q.weight",
              f"{BLOCKS}.0.img_mlp.proj.weight")
    absent = [n for n in needed if n not in shapes]
    if absent:
        raise UserInputError(f"transformer file {source} lacks {absent}: it is not a complete Qwen-Image 2.1 "
                             f"transformer. {_CHOOSE}")
    inner, in_channels = shapes["img_in.weight"]
    head_dim = shapes[f"{BLOCKS}.0.attn.norm_q.weight"][0]
    derived = dict(
        patch_size=1, in_channels=in_channels, out_channels=shapes["proj_out.weight"][0],
        num_layers=max(int(m.group(1)) for n in shapes if (m := _BLOCK.match(n))) + 1,
        attention_head_dim=head_dim, num_attention_heads=inner // head_dim,
        context_in_dim=shapes["txt_in.in_layer.weight"][1],
        mlp_ratio=shapes[f"{BLOCKS}.0.img_mlp.proj.weight"][0] // inner,
    )
    if sidecar is not None:
        return {**sidecar, **derived}
    if head_dim != sum(REAL_AXES_DIMS_ROPE):
        raise UserInputError(f"transformer file {source} has attention head size {head_dim}, not 2.1's 128, and no "
                             "config JSON beside it naming its RoPE axes (axes_dims_rope).")
    return {**derived, "axes_dims_rope": REAL_AXES_DIMS_ROPE}


def _half(scale: torch.Tensor, half: int | None) -> torch.Tensor:
    """A fused weight's scale for one of its halves: a per-tensor scale serves both, per-row scales split (rows)."""
    return scale if half is None or scale.numel() == 1 else scale.chunk(2, dim=0)[half].clone()


class QwenImage21TransformerFile:
    """A 2.1 transformer file opened for streaming (the interface of models.transformer_file.TransformerFile)."""

    def __init__(self, path: str | Path, storage: str = "float8", compute_dtype: torch.dtype = torch.bfloat16):
        self.storage, self.compute_dtype = storage, compute_dtype
        self.file = file = SafetensorsFile(path, "transformer")
        prefix = find_prefix(file.keys, (TRANSFORMER_PROBE,), TRANSFORMER_PREFIXES)
        if prefix is None:
            raise UserInputError(f"transformer file {file.path} has no {TRANSFORMER_PROBE}: it is not a Qwen-Image 2.1 "
                                 f"transformer. {_CHOOSE}")
        stripped = strip_prefix(file.keys, prefix)
        tensors, scale_keys = split_scaled_fp8(stripped, file)
        int8 = int8_weights(file, stripped)  # the file's weight name -> ConvRot group (0: none)
        # What the file's comfy_attention.config entries ask ComfyUI for (left out of the model), for the run's status.
        self.runtime_note = runtime_note(file, stripped)
        file.require_floating([*tensors.values(), *scale_keys.values()], int8_ok=[tensors[n] for n in int8 if n in tensors])
        self.keys = tensors  # the file's name (prefix stripped) -> its key
        self.mlp_layout = "fused" if any(f".{FUSED_MLP}." in n for n in tensors) else "split"
        self.names = split_names(tensors)
        self.int8 = {ours: int8[source] for ours, (source, _) in self.names.items() if source in int8}
        scales = {name: file.tensor(key) for name, key in scale_keys.items()}
        refuse_nonfinite_scales(file, {scale_keys[n]: s for n, s in scales.items()})
        # A fused weight's one scale serves both of its halves; one scale per row splits with the rows.
        self.scales = {ours: _half(scales[source], half) for ours, (source, half) in self.names.items()
                       if source in scales}
        shapes = {}
        for name, (source, half) in self.names.items():
            shape = file.shapes[tensors[source]]
            shapes[name] = shape if half is None else (shape[0] // 2, *shape[1:])
        self.config = config_from_shapes(shapes, file.sidecar_config(), str(file.path))
        self._skeleton = empty_transformer21(self.config)

    def skeleton(self) -> nn.Module:
        return self._skeleton

    def _tensors(self, given):
        for name, (source, half) in self.names.items():
            if name in given:  # the machine's shared host copy holds it (as stored): not read again
                yield name, given[name][0]
                continue
            tensor = self.file.tensor(self.keys[source])
            # clone, not contiguous: a row half of a contiguous tensor is contiguous already, and that view would
            # keep the whole fused tensor alive (each half its own read of it: 3 GiB more at the real size)
            yield name, tensor if half is None else tensor.chunk(2, dim=0)[half].clone()

    def load(self, device: torch.device = torch.device("cpu"), host_blocks: set[int] = frozenset(),
             given=None) -> nn.Module:
        """As `TransformerFile.load`, `given` included."""
        given = given or {}
        model = empty_transformer21(self.config)
        host = {f"{BLOCKS}.{i}.{n}.weight" for i in host_blocks for n, _ in frozen_linears(model.transformer_blocks[i])}
        cpu = torch.device("cpu")
        stream_into(model, self._tensors(given), self.storage, self.compute_dtype,
                    source=f"transformer file {self.file.path}",
                    scales={n: s.clone() for n, s in self.scales.items()},
                    device_for=lambda name: cpu if name in host else device, given=given, int8=self.int8)
        return model.eval()


def comfyui_transformer_tensors(transformer: nn.Module, fmt: str = "bf16", mlp: str = "fused",
                                prefix: str = "model.diffusion_model.") -> dict[str, torch.Tensor]:
    """A 2.1 transformer as ComfyUI's file holds it: `fmt` bf16, fp8_e4m3fn or fp8_e4m3fn_scaled (per Linear
    weight), the MLP `fused` (`gate_up` = [gate_layer; proj]) or `split`."""
    if mlp not in MLP_LAYOUTS:
        raise ValueError(f"mlp layout {mlp!r} is not one of {MLP_LAYOUTS}")
    state = dequantized_state_dict(transformer)
    if mlp == "fused":
        for name in [n for n in state if n.endswith(f"{FUSED_PARTS[0]}.weight")]:
            block = name[: -len(f"{FUSED_PARTS[0]}.weight")]
            gate, up = state.pop(name), state.pop(f"{block}{FUSED_PARTS[1]}.weight")
            state[f"{block}{FUSED_MLP}.weight"] = torch.cat([gate, up])
    linears = {n for n, m in transformer.named_modules() if isinstance(m, nn.Linear)}
    linears |= {n.replace(FUSED_PARTS[0], FUSED_MLP) for n in linears if n.endswith(FUSED_PARTS[0])}
    out = {}
    for name, tensor in state.items():
        module, _, leaf = name.rpartition(".")
        if fmt == "bf16" or module not in linears or leaf != "weight":
            out[name] = tensor.to(torch.bfloat16)
        elif fmt == "fp8_e4m3fn":
            out[name] = tensor.clamp(-FLOAT8_MAX, FLOAT8_MAX).to(FLOAT8)
        else:
            out[name], out[module + SCALE_WEIGHT] = quantize_per_tensor(tensor)
    if fmt == "fp8_e4m3fn_scaled":
        out[SCALED_FP8_MARKER] = torch.tensor([], dtype=FLOAT8)
    return {prefix + k: v.contiguous() for k, v in out.items()}
