"""Prompt encoding of Qwen-Image 2.1, by the pinned `QwenImage21Pipeline`'s own method.

The pipeline formats the prompt in its chat template (system message "Comprehend and analyze the provided
prompt."), runs Qwen3-VL and takes the last layer's hidden states *before* the final norm, drops the system
message's tokens and keeps the valid rows (`_get_qwen_prompt_embeds`). We call that method on a pipeline that
holds only the text encoder and the processor, so the template, the hook and the drop index are the
pipeline's, never a copy of them.

Shapes: one prompt -> embedding (L, D) fp32-or-compute-dtype as the encoder gives it, D = the encoder's width
(the transformer's `context_in_dim`); the image-slot mask (L,) is all False for a prompt without images.
"""

from __future__ import annotations

import torch


def text_pipeline(text_encoder, processor, scheduler_config: dict | None = None):
    """A `QwenImage21Pipeline` around only `text_encoder` and `processor` (no transformer, no VAE)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline

    scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler_config or {})
    return QwenImage21Pipeline(scheduler=scheduler, vae=None, text_encoder=text_encoder, processor=processor,
                               transformer=None)


@torch.no_grad()
def encode_prompt(text_encoder, processor, prompt: str) -> torch.Tensor:
    """(L, D) embedding of `prompt` alone, as the pipeline computes it for a text-to-image call."""
    pipe = text_pipeline(text_encoder, processor)
    device = next(text_encoder.parameters()).device
    embeds, mask, image_slots = pipe._get_qwen_prompt_embeds([prompt], None, device)
    assert not image_slots.any() and bool(mask.all())  # one prompt: unpadded, no image slots
    return embeds[0]
