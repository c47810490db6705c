"""A Qwen-Image transformer of any config with random weights, built directly on its device.

For memory and speed measurements, where the weights' values do not matter but their shapes, dtypes and
placement do: the model is created on the meta device and each parameter is then materialised alone on
`device` (normal with std `std`, like trained weights' typical scale), block Linear weights converted to
`storage` right away. No full-precision copy of the model ever exists, so the real 20B transformer can be
built on a GPU with float8 block weights without a download and without peaking above its final size by
more than one tensor.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.float8 import SCALE_BUFFER, install_frozen_compute, quantize_weight
from ..models.streaming import empty_transformer


@torch.no_grad()
def random_transformer(
    config: dict | None = None,
    storage: str = "float8",
    compute_dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    seed: int = 0,
    std: float = 0.02,
) -> nn.Module:
    """`QwenImageTransformer2DModel(**config)` (diffusers defaults = the real model) with random weights.

    Block Linear weights are stored as `storage` (see `float8.STORAGE_MODES`) and computed through
    `FrozenLinearFunction`; every other parameter is in `compute_dtype`. All parameters are frozen.
    """
    device = torch.device(device)
    model = empty_transformer(config or {})
    block_linears = {
        m for name, m in model.transformer_blocks.named_modules() if isinstance(m, nn.Linear)
    }
    g = torch.Generator(device=device).manual_seed(seed)
    for module in model.modules():
        for leaf, param in list(module.named_parameters(recurse=False)):
            value = torch.empty(param.shape, dtype=compute_dtype, device=device).normal_(0.0, std, generator=g)
            if module in block_linears and leaf == "weight":
                stored, scale = quantize_weight(value, storage)
                module.weight = nn.Parameter(stored, requires_grad=False)
                if scale is not None:
                    module.register_buffer(SCALE_BUFFER, scale)
                install_frozen_compute(module)
            else:
                setattr(module, leaf, nn.Parameter(value, requires_grad=False))
    # Plain tensor attributes (the RoPE tables) were built real on the CPU; move them along.
    model.pos_embed.pos_freqs = model.pos_embed.pos_freqs.to(device)
    model.pos_embed.neg_freqs = model.pos_embed.neg_freqs.to(device)
    return model.eval()
