"""The inputs of a block's modulation Linears for a given timestep, computed apart from a forward.

Every block of diffusers' `QwenImageTransformer2DModel` modulates its two streams with
`img_mod = Sequential(SiLU, Linear)` and `txt_mod = Sequential(SiLU, Linear)` of the timestep embedding `temb`:
the Linears' inputs are silu(temb), the same in every block, a function of the timestep alone. Knowing the
timesteps of the next training forwards ahead, the block runner computes their modulation outputs while a
streamed block's modulation weights are on the GPU, and those forwards copy the block without them
(`streaming.modulation_outputs`, `streaming.placement.MODULATION_WINDOW`).

The expressions below are the transformer's own for `temb` (its forward: `timestep.to(dtype)`, for
Qwen-Image-Edit-2511 (`zero_cond_t`) the timesteps followed by zeros for the control tokens, then
`time_text_embed`; the text stream takes the first half), run with the same shapes, so the values are the
forward's bit for bit; the runner compares them with the forward's own inputs on the CPU, and
`tests/engine/test_modulation_ahead.py` checks both kinds of model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .architecture import architecture_of
from .qwen_arch import IMG_STREAM, MODULATION_LINEARS, TXT_STREAM


def is_modulation_linear(name: str) -> bool:
    """Whether a frozen Linear's name inside a block (peft's wrapper adds `.base_layer`) is a modulation Linear's."""
    return name.removesuffix(".base_layer") in MODULATION_LINEARS


def supports_modulation_ahead(transformer: nn.Module) -> bool:
    """Whether the modulation inputs are a function of the timestep alone that `modulation_inputs` knows:
    no trainable parameter before them (a LoRA on the time embedding would need their gradient) and no extra
    timestep conditioning."""
    if not architecture_of(transformer).per_block_modulation:  # (2.1's one modulation Linear: outside the blocks)
        return False
    embed = transformer.time_text_embed
    return (not getattr(embed, "use_additional_t_cond", False)
            and not any(p.requires_grad for p in embed.parameters()))


@torch.no_grad()
def modulation_inputs(transformer: nn.Module, timestep: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """{modulation Linear name: its input} in every block for a forward given `timestep` (B,), as the
    transformer receives it: img_mod.1 (B, D) (Edit-2511: (2B, D)), txt_mod.1 (B, D)."""
    t = timestep.to(dtype)
    if getattr(transformer, "zero_cond_t", False):
        t = torch.cat([t, t * 0], dim=0)
    # time_text_embed reads only the dtype of its hidden_states argument.
    temb = transformer.time_text_embed(t, torch.empty(0, dtype=dtype, device=t.device))  # (B or 2B, D)
    text_temb = temb.chunk(2, dim=0)[0] if getattr(transformer, "zero_cond_t", False) else temb
    return {IMG_STREAM["mod"]: F.silu(temb), TXT_STREAM["mod"]: F.silu(text_temb)}
