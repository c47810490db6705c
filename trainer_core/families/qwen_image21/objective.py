"""The transformer inputs of Qwen-Image 2.1's training step, as `QwenImage21Pipeline.__call__` builds them.

The pipeline (text-to-image) calls its transformer with
    hidden_states = the packed latents (B, N, C), N = h * w (patch 1, `_pack_latents`)
    encoder_hidden_states = prompt embeddings (B, L, D), encoder_hidden_states_mask = (B, L) or None (all valid)
    img_mask = the prompt's image slots (False for text, (B, L)) with N / 4 True slots appended for the target
               (`append_target_slots`: one slot per 2 x 2 latent cells)
    img_shapes = [[(1, h, w)]] * B, timestep = t / 1000 (the noise level s)
and keeps the last N output rows. The block-causal attention over the prefix and the t = 0 modulation of
the text rows (`causal_condition`) are the transformer's own and need nothing here.
"""

from __future__ import annotations

import torch


def target_slots(text_slots: torch.Tensor, tokens: int) -> torch.Tensor:
    """(B, L) image-slot mask of the prompt -> (B, L + tokens / 4) with the target's slots appended."""
    return torch.cat([text_slots, text_slots.new_ones(text_slots.shape[0], tokens // 4)], dim=1)


def transformer_kwargs(hidden: torch.Tensor, grid: tuple[int, int], text: torch.Tensor,
                       text_mask: torch.Tensor | None) -> dict:
    """Keyword arguments (besides timestep) for noisy target tokens `hidden` (B, N, C) on the latent `grid`
    (h, w) and padded prompt embeddings `text` (B, L, D) with `text_mask` (B, L) or None."""
    b, length = text.shape[:2]
    tokens = grid[0] * grid[1]
    img_mask = target_slots(torch.zeros(b, length, dtype=torch.bool, device=text.device), tokens)
    return dict(hidden_states=hidden, encoder_hidden_states=text, encoder_hidden_states_mask=text_mask,
                img_shapes=[[(1, *grid)]] * b, img_mask=img_mask)
