"""The Qwen-Image VAE as one file (ComfyUI's vae/qwen_image_vae.safetensors), in the Wan 2.1 layout.

ComfyUI's file uses the module names of its Wan 2.1 VAE (comfy/ldm/wan/vae.py): flat `downsamples` /
`upsamples` sequences, `residual.<i>` inside residual blocks, `middle.<0|1|2>`, `head.<0|2>`, and
`conv1`/`conv2` for diffusers' quant_conv/post_quant_conv. diffusers' `AutoencoderKLQwenImage` has the
same modules under other names. diffusers 0.42.1 has a converter for this layout
(`convert_wan_vae_to_diffusers`), but it hard-codes the block indices of the real config
(num_res_blocks 2, four levels), so it cannot load any other size; `diffusers_to_wan_name` derives the
names from the config instead, and a test checks it agrees with diffusers' converter on the real config.

The config comes from the tensor shapes (base_dim, z_dim, dim_mult, num_res_blocks,
temperal_downsample); `latents_mean`/`latents_std` (not in the file) from the JSON beside it, else
Qwen-Image's values (`qwen_arch.LATENTS_MEAN`/`LATENTS_STD`) when the VAE has 16 latent channels. A
diffusers-layout single file is read too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..core.errors import UserInputError
from .float8 import dequantized_state_dict
from .layouts import detect_layout, strip_prefix
from .qwen_arch import LATENTS_MEAN as QWEN_IMAGE_LATENTS_MEAN
from .qwen_arch import LATENTS_STD as QWEN_IMAGE_LATENTS_STD
from .safetensors_file import SafetensorsFile
from .streaming import assign_parameter, fill_empty

# Inside a residual block: diffusers name -> Wan name (Wan's Sequential: RMS_norm, SiLU, conv, RMS_norm,
# SiLU, Dropout, conv).
_RESNET = (("norm1.", "residual.0."), ("conv1.", "residual.2."), ("norm2.", "residual.3."),
           ("conv2.", "residual.6."), ("conv_shortcut.", "shortcut."))


def _resnet_name(inner: str) -> str:
    for ours, wan in _RESNET:
        if inner.startswith(ours):
            return wan + inner[len(ours):]
    return inner  # resample.1.* and time_conv.* are named alike in both


def _mid_name(inner: str) -> str:
    """mid_block.<...> -> middle.<...>: Wan's middle is Sequential(resnet, attention, resnet)."""
    kind, index, rest = inner.split(".", 2)
    if kind == "attentions":
        return f"1.{rest}"
    return f"{0 if index == '0' else 2}.{_resnet_name(rest)}"


def diffusers_to_wan_name(name: str, num_res_blocks: int) -> str:
    """The Wan 2.1 layout name of one `AutoencoderKLQwenImage` tensor name."""
    part, _, rest = name.partition(".")
    if part in ("quant_conv", "post_quant_conv"):
        return f"{'conv1' if part == 'quant_conv' else 'conv2'}.{rest}"
    for ours, wan in (("conv_in.", "conv1."), ("norm_out.", "head.0."), ("conv_out.", "head.2.")):
        if rest.startswith(ours):
            return f"{part}.{wan}{rest[len(ours):]}"
    if rest.startswith("mid_block."):
        return f"{part}.middle.{_mid_name(rest[len('mid_block.'):])}"
    if rest.startswith("down_blocks."):  # a flat list in both layouts
        _, index, inner = rest.split(".", 2)
        return f"encoder.downsamples.{index}.{_resnet_name(inner)}"
    if rest.startswith("up_blocks."):
        # Wan's decoder is flat: per level, num_res_blocks + 1 residual blocks, then one resample.
        _, level, kind, index, inner = rest.split(".", 4)
        per_level = num_res_blocks + 2
        flat = int(level) * per_level + (int(index) if kind == "resnets" else num_res_blocks + 1)
        return f"decoder.upsamples.{flat}.{_resnet_name(inner)}"
    raise ValueError(f"no Wan 2.1 name for VAE tensor {name}")


@dataclass(frozen=True)
class _EncoderNames:
    """Where one layout keeps what the config is read from (encoder blocks are a flat list in both)."""

    conv_in: str
    post_quant_conv: str
    block: str
    resnet_probe: str
    resnet_conv1: str
    resample: str


_WAN = _EncoderNames("encoder.conv1.weight", "conv2.weight", "encoder.downsamples.{}.", "residual.0.gamma",
                     "residual.2.weight", "resample.1.weight")
_DIFFUSERS = _EncoderNames("encoder.conv_in.weight", "post_quant_conv.weight", "encoder.down_blocks.{}.",
                           "norm1.gamma", "conv1.weight", "resample.1.weight")


def vae_config_from_shapes(shapes: dict[str, tuple[int, ...]], layout: str, source: str) -> dict:
    """base_dim, z_dim, dim_mult, num_res_blocks, temperal_downsample from the encoder's tensor shapes."""
    names = _WAN if layout == "wan" else _DIFFUSERS
    pattern = re.compile(re.escape(names.block).replace(r"\{\}", r"(\d+)"))
    indices = sorted({int(m.group(1)) for n in shapes if (m := pattern.match(n))})
    try:
        base_dim = shapes[names.conv_in][0]  # conv_in: (base_dim, 3, 3, 3, 3)
        z_dim = shapes[names.post_quant_conv][0]  # post_quant_conv: (z, z, 1, 1, 1)
        levels: list[list[int]] = [[]]  # residual block indices per level
        temporal: list[bool] = []
        for i in indices:
            block = names.block.format(i)
            if block + names.resnet_probe in shapes:
                levels[-1].append(i)
            elif block + names.resample in shapes:
                temporal.append(block + "time_conv.weight" in shapes)
                levels.append([])
            else:  # an attention block inside the down path: attn_scales, which Qwen-Image does not use
                raise KeyError(block + names.resnet_probe)
        num_res_blocks = len(levels[0])
        if not num_res_blocks or any(len(level) != num_res_blocks for level in levels):
            raise KeyError("residual blocks per level")
        dim_mult = [shapes[names.block.format(level[0]) + names.resnet_conv1][0] // base_dim for level in levels]
    except KeyError as e:
        raise UserInputError(f"VAE file {source} does not have the structure of a Qwen-Image (Wan 2.1) VAE "
                             f"(looking for {e}). Choose qwen_image_vae.safetensors.") from e
    # image channels: 3, or 4 for Qwen-Image-Layered's RGBA VAE (conv_in: (base_dim, channels, 3, 3, 3))
    return dict(base_dim=base_dim, z_dim=z_dim, dim_mult=dim_mult, num_res_blocks=num_res_blocks,
                temperal_downsample=temporal, attn_scales=[], input_channels=shapes[names.conv_in][1])


def vae_config(shapes: dict[str, tuple[int, ...]], layout: str, sidecar: dict | None, source: str) -> dict:
    derived = vae_config_from_shapes(shapes, layout, source)
    if sidecar is not None:
        clashes = {k: (v, sidecar[k]) for k, v in derived.items() if k in sidecar and _as_list(sidecar[k]) != _as_list(v)}
        if clashes:
            raise UserInputError(f"the config JSON beside {source} disagrees with the file's tensors "
                                 f"(name: (from tensors, from JSON)): {clashes}. Fix or delete the JSON.")
        if "latents_mean" in sidecar and "latents_std" in sidecar:
            for key in ("latents_mean", "latents_std"):
                values = sidecar[key]
                if (not isinstance(values, list) or len(values) != derived["z_dim"]
                        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                   for v in values) or (key == "latents_std" and min(values) <= 0)):
                    raise UserInputError(f"the config JSON beside {source} has {key}={values!r}: it must be "
                                         f"{derived['z_dim']} finite numbers (one per latent channel"
                                         f"{', all positive' if key == 'latents_std' else ''}). Fix or delete the JSON.")
            return {**derived, "latents_mean": sidecar["latents_mean"], "latents_std": sidecar["latents_std"]}
    if derived["z_dim"] != len(QWEN_IMAGE_LATENTS_MEAN):
        raise UserInputError(
            f"VAE file {source} has {derived['z_dim']} latent channels, not Qwen-Image's {len(QWEN_IMAGE_LATENTS_MEAN)}, "
            "and no config JSON beside it with latents_mean/latents_std. Choose qwen_image_vae.safetensors."
        )
    return {**derived, "latents_mean": list(QWEN_IMAGE_LATENTS_MEAN), "latents_std": list(QWEN_IMAGE_LATENTS_STD)}


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else value


class VaeFile:
    """A VAE file whose header is read and checked at once; calling it reads the weights (a new model each call)."""

    def __init__(self, path: str | Path, compute_dtype: torch.dtype = torch.bfloat16):
        self.compute_dtype = compute_dtype
        self.file = file = SafetensorsFile(path, "vae")
        self.layout, prefix = detect_layout(file.path, "vae", file.keys)
        self.names = strip_prefix(file.keys, prefix)
        file.require_floating(self.names.values())
        shapes = {n: file.shapes[k] for n, k in self.names.items()}
        self.config = vae_config(shapes, self.layout, file.sidecar_config(), str(file.path))

    def __call__(self) -> nn.Module:
        """diffusers' `AutoencoderKLQwenImage` on the CPU, frozen, in eval mode."""
        from accelerate import init_empty_weights
        from diffusers import AutoencoderKLQwenImage

        config, names = self.config, self.names
        with init_empty_weights(include_buffers=False):
            vae = AutoencoderKLQwenImage(**config)
        if self.layout == "wan":
            to_ours = {diffusers_to_wan_name(n, config["num_res_blocks"]): n for n, _ in vae.named_parameters()}
            names = {to_ours.get(n, n): k for n, k in names.items()}  # unmapped names stay, reported as unknown
        fill_empty(vae, ((n, self.file.tensor(k)) for n, k in names.items()),
                   lambda module, leaf, name, tensor: assign_parameter(module, leaf, tensor.to(self.compute_dtype)),
                   source=f"VAE file {self.file.path}", hint="Choose qwen_image_vae.safetensors.")
        return vae.eval()


def load_vae_file(path: str | Path, compute_dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """diffusers' `AutoencoderKLQwenImage` from one file (Wan 2.1 or diffusers layout), CPU, frozen, eval."""
    return VaeFile(path, compute_dtype)()


def vae_file_tensors(vae: nn.Module, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """The VAE's tensors under ComfyUI's Wan 2.1 names, in `dtype` (the real file is bf16)."""
    num_res_blocks = vae.config.num_res_blocks
    return {diffusers_to_wan_name(n, num_res_blocks): t.to(dtype).contiguous()
            for n, t in dequantized_state_dict(vae).items()}
