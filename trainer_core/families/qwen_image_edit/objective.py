"""Control tokens in the transformer's input, as the edit pipelines put them there.

The pipelines concatenate the packed control latents after the noisy target's tokens on the sequence axis
and give the transformer one `img_shapes` entry per image, target first:

    hidden_states = [target tokens (N = h/2 * w/2) | control 1 tokens | control 2 tokens | ...]  (B, N + M, 4C)
    img_shapes    = [[(1, h/2, w/2), (1, h1/2, w1/2), (1, h2/2, w2/2), ...]] * B

and keep only the first N output tokens (`noise_pred[:, : latents.size(1)]`). The flow-matching loss is taken
on those N tokens only: control tokens are conditions, not predictions. Edit-2511's transformer
(`zero_cond_t`) runs the tokens after the first `img_shapes` entry at timestep 0 by itself, from these very
`img_shapes`, so nothing else changes here.
"""

from __future__ import annotations

import torch

from ...models.latents import pack_latents
from ...models.qwen_arch import PATCH_SIZE


def control_shapes(controls: list[torch.Tensor]) -> list[tuple[int, int, int]]:
    """`img_shapes` entries of control latents [(C, h_i, w_i)]: (1, h_i/2, w_i/2) each."""
    return [(1, c.shape[-2] // PATCH_SIZE, c.shape[-1] // PATCH_SIZE) for c in controls]


def append_controls(target_tokens: torch.Tensor, grid: tuple[int, int],
                    controls: list[list[torch.Tensor]]) -> tuple[torch.Tensor, list[list[tuple[int, int, int]]]]:
    """(target tokens (B, N, 4C), the target's token grid, per sample its control latents [(C, h_i, w_i)]) ->
    (hidden_states (B, N + M, 4C), img_shapes). The samples of a batch have controls of equal shapes."""
    shapes = control_shapes(controls[0])
    if any(control_shapes(c) != shapes for c in controls):
        raise ValueError("the samples of one micro-batch must have control images of the same sizes")
    packed = [torch.cat([pack_latents(c.unsqueeze(0)) for c in sample], dim=1) for sample in controls]  # (1, M, 4C) each
    tokens = torch.cat(packed).to(target_tokens.device, target_tokens.dtype)  # (B, M, 4C)
    img_shapes = [[(1, *grid), *shapes]] * target_tokens.shape[0]
    return torch.cat([target_tokens, tokens], dim=1), img_shapes
