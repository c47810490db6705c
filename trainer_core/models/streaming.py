"""Fill an empty (meta) transformer tensor by tensor, storing block Linears as requested on the way.

A 20B transformer never exists twice in memory: each tensor is read, converted (float8 for block
Linears, compute dtype for the rest) and assigned before the next is read.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..errors import UserInputError
from .float8 import SCALE_BUFFER, install_frozen_compute, quantize_weight


def empty_transformer(config: dict) -> nn.Module:
    """The transformer with parameters on the meta device (plain tensor attributes stay real)."""
    from accelerate import init_empty_weights
    from diffusers import QwenImageTransformer2DModel

    with init_empty_weights(include_buffers=False):
        return QwenImageTransformer2DModel.from_config(config)


def _block_linear_names(model: nn.Module) -> set[str]:
    return {
        name for name, m in model.transformer_blocks.named_modules(prefix="transformer_blocks")
        if isinstance(m, nn.Linear)
    }


@torch.no_grad()
def stream_into(
    model: nn.Module,
    tensors: Iterable[tuple[str, torch.Tensor]],
    storage: str,
    compute_dtype: torch.dtype,
    source: str,
    scales: dict[str, torch.Tensor] | None = None,
) -> None:
    """Assign every (name, tensor) to `model`; block Linear weights get `storage`, the rest `compute_dtype`.

    `scales` optionally maps a weight name to the per-tensor or per-row scale it was stored with
    (scaled-fp8 files); such weights are dequantised before being stored again.
    Raises a `UserInputError` naming `source` for unknown or missing tensors.
    """
    block_linears = _block_linear_names(model)
    expected = dict(model.named_parameters())
    seen: set[str] = set()
    unexpected: list[str] = []
    for name, tensor in tensors:
        if name not in expected:
            unexpected.append(name)
            continue
        module_name, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_name)
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise UserInputError(
                f"{source}: tensor {name} has shape {tuple(tensor.shape)}, the model expects "
                f"{tuple(expected[name].shape)}. The file is not this Qwen-Image transformer."
            )
        if scales and name in scales:
            tensor = tensor.float() * scales[name].float()
        if module_name in block_linears and leaf == "weight":
            stored, row_scale = quantize_weight(tensor, storage)
            module.weight = nn.Parameter(stored, requires_grad=False)
            if row_scale is not None:
                module.register_buffer(SCALE_BUFFER, row_scale)
            install_frozen_compute(module)
        else:
            setattr(module, leaf, nn.Parameter(tensor.to(compute_dtype), requires_grad=False))
        seen.add(name)
    missing = sorted(set(expected) - seen)
    if missing or unexpected:
        detail = []
        if missing:
            detail.append(f"{len(missing)} missing (first: {missing[:3]})")
        if unexpected:
            detail.append(f"{len(unexpected)} unknown (first: {unexpected[:3]})")
        raise UserInputError(
            f"{source} does not match the Qwen-Image transformer: {', '.join(detail)}. "
            "Choose a Qwen-Image transformer file (for example qwen_image_fp8_e4m3fn.safetensors)."
        )
