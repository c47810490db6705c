"""Qwen-Image 2.1's VAE as ComfyUI's single file (models/vae, e.g. qwen_image_2.1_vae_bf16.safetensors): reader
and writer, into and out of diffusers' `AutoencoderKLQwenImage21`, which has no single-file converter.

The layout is what a newer ComfyUI reads (Comfy-Org/ComfyUI comfy/sd.py at 033046c, in the search index; no
runnable ComfyUI here has it): a file with `decoder.middle.0.residual.0.gamma`, the Wan 2.2 nesting
(`decoder.upsamples.0.upsamples.0.residual.2.weight`) and a 5-D `decoder.head.2.weight` with temporal size 1 is
"Qwen Image 2.1 VAE: Wan 2.2 layout, temporal kernel 1, no patchify, RGBA", built as comfy.ldm.wan.vae2_2.WanVAE
(at 32671a6) with dim = encoder.conv1's rows, dec_dim = decoder.head.0.gamma's, z_dim 64, dim_mult [1, 2, 4, 8, 8],
num_res_blocks 2, temperal_downsample [False, True, True, True], image channels = decoder.head.2's rows, patch 1,
temporal kernel 1. Its module names, against diffusers' (R = num_res_blocks):

    diffusers                                     ComfyUI (WanVAE)
    {encoder,decoder}.conv_in                     {encoder,decoder}.conv1
    encoder.down_blocks.i.resnets.j               encoder.downsamples.i.downsamples.j
    encoder.down_blocks.i.downsampler             encoder.downsamples.i.downsamples.R       (resample.1, time_conv)
    decoder.up_blocks.i.resnets.j                 decoder.upsamples.i.upsamples.j           (R + 1 per level)
    decoder.up_blocks.i.upsampler                 decoder.upsamples.i.upsamples.(R + 1)
    *.mid_block.resnets.0 / attentions.0 / resnets.1   *.middle.0 / 1 / 2
    *.norm_out, *.conv_out                        *.head.0, *.head.2
    quant_conv, post_quant_conv                   conv1, conv2
    in a residual block: norm1, conv1, norm2, conv2, conv_shortcut -> residual.0, .2, .3, .6, shortcut

Shapes: ComfyUI's CausalConv3d weights are 5-D (out, in, 1, kh, kw) where diffusers' Conv2d are 4-D (out, in,
kh, kw): every conv but a resample's `resample.1` and the attention's `to_qkv` / `proj` (Conv2d in both). Norm
gammas and biases are the same in both. The config comes from the shapes (as ComfyUI's does, but each size read
rather than assumed, so a tiny file loads too); latents_mean/std, which the file lacks, from the JSON beside it,
else diffusers' defaults (the published 2.1's) when it has 64 latent channels.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from ...core.errors import UserInputError
from ...models.layouts import VAE_PREFIXES, find_prefix, strip_prefix
from ...models.safetensors_file import SafetensorsFile
from ...models.streaming import assign_parameter, fill_empty

PROBE = "decoder.upsamples.0.upsamples.0.residual.2.weight"  # the Wan 2.2 nesting (Qwen-Image's is flat)
HEAD = "decoder.head.2.weight"
_HINT = "Choose Qwen-Image 2.1's VAE file (ComfyUI folder models/vae, e.g. qwen_image_2.1_vae_bf16.safetensors)."
_RESNET = (("norm1.", "residual.0."), ("conv1.", "residual.2."), ("norm2.", "residual.3."),
           ("conv2.", "residual.6."), ("conv_shortcut.", "shortcut."))
_FLAT_2D = (".resample.1.weight", ".middle.1.to_qkv.weight", ".middle.1.proj.weight")  # Conv2d in both layouts


def _resnet(inner: str) -> str:
    for ours, theirs in _RESNET:
        if inner.startswith(ours):
            return theirs + inner[len(ours):]
    return inner  # a resample's resample.1 / time_conv: the same names


def comfyui_name(name: str, num_res_blocks: int) -> str:
    """ComfyUI's name of one `AutoencoderKLQwenImage21` tensor (module docstring's table)."""
    part, _, rest = name.partition(".")
    if part in ("quant_conv", "post_quant_conv"):
        return f"{'conv1' if part == 'quant_conv' else 'conv2'}.{rest}"
    for ours, theirs in (("conv_in.", "conv1."), ("norm_out.", "head.0."), ("conv_out.", "head.2.")):
        if rest.startswith(ours):
            return f"{part}.{theirs}{rest[len(ours):]}"
    if rest.startswith("mid_block."):
        kind, index, inner = rest[len("mid_block."):].split(".", 2)
        slot = 1 if kind == "attentions" else (0 if index == "0" else 2)
        return f"{part}.middle.{slot}.{inner if kind == 'attentions' else _resnet(inner)}"
    for ours, theirs, sampler, extra in (("down_blocks.", "downsamples", "downsampler.", 0),
                                         ("up_blocks.", "upsamples", "upsampler.", 1)):
        if rest.startswith(ours):
            level, inner = rest[len(ours):].split(".", 1)
            if inner.startswith(sampler):
                return f"{part}.{theirs}.{level}.{theirs}.{num_res_blocks + extra}.{inner[len(sampler):]}"
            _, index, inner = inner.split(".", 2)  # resnets.<j>.<...>
            return f"{part}.{theirs}.{level}.{theirs}.{index}.{_resnet(inner)}"
    raise ValueError(f"no ComfyUI name for 2.1 VAE tensor {name}")


def is_5d(comfy_name: str, tensor_ndim: int) -> bool:
    """Whether ComfyUI holds this (4-D in diffusers) weight as a CausalConv3d's 5-D one."""
    return tensor_ndim == 4 and comfy_name.endswith(".weight") and not comfy_name.endswith(_FLAT_2D)


def comfyui_vae_tensors(vae: nn.Module, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """An `AutoencoderKLQwenImage21` as ComfyUI's 2.1 VAE file holds it, in `dtype` (the published file is bf16)."""
    out = {}
    for name, tensor in vae.state_dict().items():
        theirs = comfyui_name(name, vae.config.num_res_blocks)
        tensor = tensor.detach().to("cpu", dtype)
        out[theirs] = (tensor.unsqueeze(2) if is_5d(theirs, tensor.ndim) else tensor).contiguous()
    return out


def is_qwen_image21_vae_keys(keys) -> bool:
    return find_prefix(keys, (PROBE,), VAE_PREFIXES) is not None


_LEVEL = re.compile(r"encoder\.downsamples\.(\d+)\.downsamples\.(\d+)\.")


def config_from_shapes(shapes: dict[str, tuple[int, ...]], sidecar: dict | None, source: str) -> dict:
    """diffusers' config of the file's VAE, from its shapes (and the JSON beside it for latents_mean/std)."""
    try:
        conv_in, head = shapes["encoder.conv1.weight"], shapes[HEAD]
        blocks: dict[int, set[int]] = {}
        for name in shapes:
            if m := _LEVEL.match(name):
                blocks.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
        levels = sorted(blocks)
        num_res_blocks = len({j for j in blocks[0] if f"encoder.downsamples.0.downsamples.{j}.residual.0.gamma" in shapes})
        base = conv_in[0]
        derived = dict(
            base_dim=base, decoder_base_dim=shapes["decoder.head.0.gamma"][0], z_dim=shapes["conv2.weight"][0],
            dim_mult=[shapes[f"encoder.downsamples.{i}.downsamples.0.residual.2.weight"][0] // base for i in levels],
            num_res_blocks=num_res_blocks, in_channels=conv_in[1], out_channels=head[0], attn_scales=[],
            temperal_downsample=[f"encoder.downsamples.{i}.downsamples.{num_res_blocks}.time_conv.weight" in shapes
                                 for i in levels[:-1]])
    except (KeyError, IndexError) as e:
        raise UserInputError(f"VAE file {source} does not have the structure of Qwen-Image 2.1's VAE (looking for "
                             f"{e}). {_HINT}") from e
    temporal = sorted({s[2] for n, s in shapes.items() if len(s) == 5})
    if temporal != [1]:
        raise UserInputError(f"VAE file {source} has 3-D convolutions with temporal size {temporal}, not 2.1's 1: it "
                             f"is a Wan 2.2 video VAE, not Qwen-Image 2.1's. {_HINT}")
    if sidecar is not None and "latents_mean" in sidecar and "latents_std" in sidecar:
        return {**derived, "latents_mean": list(sidecar["latents_mean"]), "latents_std": list(sidecar["latents_std"])}
    if derived["z_dim"] != 64:
        raise UserInputError(f"VAE file {source} has {derived['z_dim']} latent channels, not 2.1's 64, and no config "
                             f"JSON beside it with latents_mean/latents_std. {_HINT}")
    return derived  # diffusers' defaults are the published 2.1's latents_mean/std


class QwenImage21VaeFile:
    """A 2.1 VAE file whose header is read and checked at once; calling it reads the weights (a new model each
    call), as models.vae_file.VaeFile does for Qwen-Image's."""

    def __init__(self, path: str | Path, compute_dtype: torch.dtype = torch.bfloat16):
        self.compute_dtype = compute_dtype
        self.file = file = SafetensorsFile(path, "vae")
        prefix = find_prefix(file.keys, (PROBE,), VAE_PREFIXES)
        if prefix is None:
            raise UserInputError(f"VAE file {file.path} has no {PROBE}: it is not in the layout of Qwen-Image 2.1's "
                                 f"VAE. {_HINT}")
        self.names = strip_prefix(file.keys, prefix)  # ComfyUI's name -> the file's key
        file.require_floating(self.names.values())
        shapes = {n: file.shapes[k] for n, k in self.names.items()}
        self.config = config_from_shapes(shapes, file.sidecar_config(), str(file.path))

    def __call__(self) -> nn.Module:
        """diffusers' `AutoencoderKLQwenImage21` on the CPU, frozen, in eval mode."""
        from accelerate import init_empty_weights
        from diffusers import AutoencoderKLQwenImage21

        with init_empty_weights(include_buffers=False):
            vae = AutoencoderKLQwenImage21(**self.config)
        ours = {comfyui_name(n, self.config["num_res_blocks"]): n for n, _ in vae.named_parameters()}

        def tensors():
            for theirs, key in self.names.items():
                tensor = self.file.tensor(key)
                yield ours.get(theirs, theirs), tensor.squeeze(2) if is_5d(theirs, tensor.ndim - 1) else tensor

        fill_empty(vae, tensors(), lambda module, leaf, name, t: assign_parameter(module, leaf, t.to(self.compute_dtype)),
                   source=f"VAE file {self.file.path}", hint=_HINT)
        return vae.requires_grad_(False).eval()
