"""The transformer inputs of Qwen-Image 2.1's training step, as `QwenImage21Pipeline.__call__` builds them.

The pipeline calls its transformer with
    hidden_states = [reference tokens | noisy target tokens]  (B, M + N, C): each reference's latents packed
               one token per cell (`prepare_latents`), then the target's (N = h * w, patch 1); M = 0 without
    encoder_hidden_states = prompt embeddings (B, L, D), encoder_hidden_states_mask = (B, L) or None (all valid)
    img_mask = the prompt's image slots ((B, L): True at its `<|image_pad|>` tokens, one per 2 x 2 cells of a
               reference; all False without references) with N / 4 True slots appended for the target
               (`append_target_slots`)
    img_shapes = [[*(1, h_i, w_i) per reference, (1, h, w)]] * B, timestep = t / 1000 (the noise level s)
and keeps the last N output rows. The block-causal attention over the prefix, the references' tokens dropped
into their slots and the t = 0 modulation of text and references (`causal_condition`) are the transformer's
own and need nothing here. The transformer reads the layout from row 0: a micro-batch's samples share their
references' sizes (`batch_group`), so their slots sit at the same positions (the template puts the images
before the caption) and only the caption's length differs (right padding, masked).
"""

from __future__ import annotations

import torch

from .references import reference_shapes, reference_tokens


def target_slots(text_slots: torch.Tensor, tokens: int) -> torch.Tensor:
    """(B, L) image-slot mask of the prompt -> (B, L + tokens / 4) with the target's slots appended."""
    return torch.cat([text_slots, text_slots.new_ones(text_slots.shape[0], tokens // 4)], dim=1)


def padded_slots(slots: list[torch.Tensor], length: int, device) -> torch.Tensor:
    """Per prompt its image slots (L_i,) -> (B, length) bool, right-padded with False (no slots in padding).
    Refused unless every row has its slots where row 0 has them (the transformer reads row 0's layout)."""
    rows = torch.zeros(len(slots), length, dtype=torch.bool, device=device)
    for i, s in enumerate(slots):
        rows[i, : s.shape[0]] = s.to(device)
    if not bool((rows == rows[:1]).all()):
        raise ValueError("the prompts of one micro-batch have their reference images' slots at different positions")
    return rows


def transformer_kwargs(hidden: torch.Tensor, grid: tuple[int, int], text: torch.Tensor,
                       text_mask: torch.Tensor | None, references: list[list[torch.Tensor]] | None = None,
                       slots: list[torch.Tensor] | None = None) -> dict:
    """Keyword arguments (besides timestep) for noisy target tokens `hidden` (B, N, C) on the latent `grid`
    (h, w), padded prompt embeddings `text` (B, L, D) with `text_mask` (B, L) or None, and per sample its
    reference latents [(C, h_i, w_i)] with each prompt's image slots (L_i,) (None: text-to-image)."""
    b, length = text.shape[:2]
    tokens = grid[0] * grid[1]
    shapes = [(1, *grid)]
    if references and references[0]:
        shapes = [*reference_shapes(references[0]), (1, *grid)]
        if any(reference_shapes(r) != shapes[:-1] for r in references):
            raise ValueError("the samples of one micro-batch must have reference images of the same sizes")
        refs = torch.cat([reference_tokens(r) for r in references]).to(hidden.device, hidden.dtype)  # (B, M, C)
        hidden = torch.cat([refs, hidden], dim=1)
        prompt_slots = padded_slots(slots, length, text.device)
    else:
        prompt_slots = torch.zeros(b, length, dtype=torch.bool, device=text.device)
    return dict(hidden_states=hidden, encoder_hidden_states=text, encoder_hidden_states_mask=text_mask,
                img_shapes=[shapes] * b, img_mask=target_slots(prompt_slots, tokens))
