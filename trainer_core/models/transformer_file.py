"""The Qwen-Image transformer as one file (ComfyUI's diffusion_models/qwen_image_*.safetensors).

Layout: diffusers' module names (`transformer_blocks.3.attn.to_q.weight`, ...), bare or under one of
the prefixes in `layouts.TRANSFORMER_PREFIXES`. Weights in bf16, or Linear weights in float8_e4m3fn,
optionally "scaled" (ComfyUI's `scale_weight` per Linear plus a `scaled_fp8` marker), or ComfyUI's int8
layers (`comfy_quant` int8_tensorwise, ConvRot-rotated or not: models/int8_convrot.py), kept in one byte.

Reading streams tensor by tensor onto an empty model (`streaming.stream_into`), so the block Linears
are stored as `storage` asks without a full bf16 copy ever existing. The config is derived from the
tensor shapes (block count, widths, channels); the two values shapes cannot tell come from the JSON
beside the file when there is one, else from Qwen-Image's own values (`qwen_arch`):
- `patch_size`: 2 (proj_out has patch_size**2 * out_channels rows; ComfyUI assumes 2 as well);
- `axes_dims_rope`: (16, 56, 56), which needs attention_head_dim 128 (their sum).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from ..core.errors import UserInputError
from .float8 import FLOAT8, FLOAT8_MAX, STORAGE_MODES, dequantized_state_dict, frozen_linears, quantize_per_tensor
from .layouts import (
    SCALE_WEIGHT,
    SCALED_FP8_MARKER,
    detect_layout,
    int8_weights,
    refuse_nonfinite_scales,
    runtime_note,
    split_scaled_fp8,
    strip_prefix,
)
from .qwen_arch import AXES_DIMS_ROPE as QWEN_IMAGE_AXES_DIMS_ROPE
from .qwen_arch import BLOCKS, PATCH_SIZE
from .safetensors_file import SafetensorsFile
from .streaming import Given, empty_transformer, stream_into

TRANSFORMER_FILE_FORMATS = ("bf16", "fp8_e4m3fn", "fp8_e4m3fn_scaled")
_BLOCK = re.compile(BLOCKS + r"\.(\d+)\.")
LAYERED_KEY = "time_text_embed.addition_t_embedding.weight"  # only Qwen-Image-Layered has it


def transformer_config_from_shapes(shapes: dict[str, tuple[int, ...]], source: str) -> dict:
    """The config values the tensor shapes determine (names without prefix -> shape)."""
    needed = ("img_in.weight", "txt_in.weight", "proj_out.weight", f"{BLOCKS}.0.attn.norm_q.weight")
    absent = [n for n in needed if n not in shapes]
    if absent:
        raise UserInputError(f"transformer file {source} lacks {absent}: it is not a complete Qwen-Image "
                             "transformer. Choose qwen_image_fp8_e4m3fn.safetensors or qwen_image_bf16.safetensors.")
    inner_dim, in_channels = shapes["img_in.weight"]  # (heads * head_dim, 4 * latent channels)
    head_dim = shapes[f"{BLOCKS}.0.attn.norm_q.weight"][0]
    blocks = {int(m.group(1)) for n in shapes if (m := _BLOCK.match(n))}
    # Qwen-Image-Layered: its timestep embedding has `addition_t_embedding`, and it runs layer-3D RoPE (what
    # ComfyUI's model_detection reads from this key too).
    layered = {"use_additional_t_cond": True, "use_layer3d_rope": True} if LAYERED_KEY in shapes else {}
    return dict(
        **layered,
        patch_size=PATCH_SIZE,
        in_channels=in_channels,
        out_channels=shapes["proj_out.weight"][0] // PATCH_SIZE**2,  # proj_out: (p * p * out, inner)
        num_layers=max(blocks) + 1,
        attention_head_dim=head_dim,
        num_attention_heads=inner_dim // head_dim,
        joint_attention_dim=shapes["txt_in.weight"][1],  # txt_in: (inner, text hidden size)
    )


def transformer_config(shapes: dict[str, tuple[int, ...]], sidecar: dict | None, source: str) -> dict:
    """Shapes' values, completed by the sidecar JSON's config or Qwen-Image's constants."""
    derived = transformer_config_from_shapes(shapes, source)
    if sidecar is not None:
        clashes = {k: (v, sidecar[k]) for k, v in derived.items() if k in sidecar and sidecar[k] != v}
        if clashes:
            raise UserInputError(f"the config JSON beside {source} disagrees with the file's tensors "
                                 f"(name: (from tensors, from JSON)): {clashes}. Fix or delete the JSON.")
        axes = sidecar.get("axes_dims_rope")
        if axes is not None and (not isinstance(axes, (list, tuple)) or not all(type(a) is int for a in axes)
                                 or sum(axes) != derived["attention_head_dim"]):
            raise UserInputError(f"the config JSON beside {source} has axes_dims_rope={axes!r}: it must be whole "
                                 f"numbers summing to the attention head size {derived['attention_head_dim']}. Fix or "
                                 "delete the JSON.")
        return {**sidecar, **derived}
    if derived["attention_head_dim"] != sum(QWEN_IMAGE_AXES_DIMS_ROPE):
        raise UserInputError(
            f"transformer file {source} has attention head size {derived['attention_head_dim']}, not Qwen-Image's "
            f"{sum(QWEN_IMAGE_AXES_DIMS_ROPE)}, and no config JSON beside it naming its RoPE axes "
            f"(axes_dims_rope). Put <file name>.json beside it (see `python -m trainer_core export-tiny`)."
        )
    return {**derived, "axes_dims_rope": QWEN_IMAGE_AXES_DIMS_ROPE}


class TransformerFile:
    """A transformer file opened for streaming: its header is read and checked at once, its weights only
    by `load`, each time straight into where training keeps them."""

    def __init__(self, path: str | Path, storage: str = "float8", compute_dtype: torch.dtype = torch.bfloat16,
                 extra_config: dict | None = None):
        """`extra_config`: config values no tensor tells (Edit-2511's `zero_cond_t`, families/qwen_image_edit/files.py)."""
        if storage not in STORAGE_MODES:
            raise UserInputError(f"storage={storage!r} is not one of {list(STORAGE_MODES)}.")
        self.storage, self.compute_dtype = storage, compute_dtype
        self.file = file = SafetensorsFile(path, "transformer")
        _, prefix = detect_layout(file.path, "transformer", file.keys)
        names = strip_prefix(file.keys, prefix)
        self.names, self.scale_keys = split_scaled_fp8(names, file)
        self.int8 = int8_weights(file, names)  # weight name -> ConvRot group (0: none)
        # What the file's comfy_attention.config entries ask ComfyUI for (left out of the model), for the run's status.
        self.runtime_note = runtime_note(file, names)
        file.require_floating([*self.names.values(), *self.scale_keys.values()],
                              int8_ok=[self.names[n] for n in self.int8 if n in self.names])
        self.config = transformer_config({n: file.shapes[k] for n, k in self.names.items()}, file.sidecar_config(),
                                         str(file.path))
        self.config = {**self.config, **(extra_config or {})}
        self._skeleton: nn.Module | None = None
        self.skeleton()  # a config JSON that does not describe the model is refused now, not at Init
        # One fp32 scale per Linear (a few KB): read and checked now, so damage shows when the file is chosen.
        self.scales = {name: file.tensor(key) for name, key in self.scale_keys.items()}
        refuse_nonfinite_scales(file, {self.scale_keys[n]: s for n, s in self.scales.items()})

    def _empty(self) -> nn.Module:
        try:
            return empty_transformer(self.config)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise UserInputError(f"the config JSON beside transformer file {self.file.path} does not describe a "
                                 f"Qwen-Image transformer ({type(e).__name__}: {e}). Fix or delete the JSON.") from e

    def skeleton(self) -> nn.Module:
        """The model's modules on the meta device (for names, shapes, counts); never holds weights."""
        if self._skeleton is None:
            self._skeleton = self._empty()
        return self._skeleton

    def load(self, device: torch.device = torch.device("cpu"), host_blocks: set[int] = frozenset(),
             given: Given | None = None) -> nn.Module:
        """The frozen model in eval mode: the frozen Linear weights of the blocks in `host_blocks` (and their
        scales) in host memory, everything else on `device`. Block Linear weights stored per `storage`.
        The tensors in `given` (the machine's shared host copy, as stored) are taken as they are, not read."""
        return self.fill(self._empty(), device, host_blocks, given)

    def fill(self, model: nn.Module, device: torch.device = torch.device("cpu"),
             host_blocks: set[int] = frozenset(), given: Given | None = None) -> nn.Module:
        """`load` into an empty model made by `empty_transformer(self.config)`."""
        given = given or {}
        scales = {name: scale.clone() for name, scale in self.scales.items()}  # the model's own copies
        blocks = model.transformer_blocks
        host_weights = {f"{BLOCKS}.{i}.{name}.weight" for i in host_blocks for name, _ in frozen_linears(blocks[i])}
        cpu = torch.device("cpu")

        def device_for(name: str) -> torch.device:
            return cpu if name in host_weights else device

        tensors = ((n, given[n][0] if n in given else self.file.tensor(k)) for n, k in self.names.items())
        stream_into(model, tensors, self.storage, self.compute_dtype, source=f"transformer file {self.file.path}",
                    scales=scales, device_for=device_for, given=given, int8=self.int8)
        return model.eval()


def load_transformer_file(
    path: str | Path, storage: str = "float8", compute_dtype: torch.dtype = torch.bfloat16,
    extra_config: dict | None = None,
) -> nn.Module:
    """The diffusers `QwenImageTransformer2DModel` from one file, on the CPU, frozen, in eval mode.

    Block Linear weights are stored per `storage` (see models/float8/); everything else in `compute_dtype`.
    `extra_config`: config values no tensor tells (Edit-2511's `zero_cond_t`, families/qwen_image_edit/files.py).
    """
    return TransformerFile(path, storage, compute_dtype, extra_config).load()


def transformer_file_tensors(transformer: nn.Module, fmt: str = "bf16", prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors of a transformer file in `fmt` (one of TRANSFORMER_FILE_FORMATS), keys under `prefix`.

    bf16: every tensor bf16. fp8_e4m3fn: every Linear weight cast to float8 (clamped to +-448), the rest
    bf16. fp8_e4m3fn_scaled: every Linear weight float8 with its fp32 `scale_weight`, plus the
    `scaled_fp8` marker, as ComfyUI's scaled-fp8 operations (comfy/ops.py) hold them.
    """
    if fmt not in TRANSFORMER_FILE_FORMATS:
        raise ValueError(f"unknown transformer file format {fmt!r}; expected one of {TRANSFORMER_FILE_FORMATS}")
    linears = {name for name, m in transformer.named_modules() if isinstance(m, nn.Linear)}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in dequantized_state_dict(transformer).items():
        module_name, _, leaf = name.rpartition(".")
        if fmt == "bf16" or module_name not in linears or leaf != "weight":
            out[name] = tensor.to(torch.bfloat16)
        elif fmt == "fp8_e4m3fn":
            out[name] = tensor.clamp(-FLOAT8_MAX, FLOAT8_MAX).to(FLOAT8)
        else:
            out[name], out[module_name + SCALE_WEIGHT] = quantize_per_tensor(tensor)
    if fmt == "fp8_e4m3fn_scaled":
        out[SCALED_FP8_MARKER] = torch.tensor([], dtype=FLOAT8)  # dtype = the fp8 format, as ComfyUI writes it
    return {prefix + k: v.contiguous() for k, v in out.items()}
