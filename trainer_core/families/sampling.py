"""Preview images from the adapter as it is now, with the model family's pinned diffusers pipeline.

The pipeline (`family.preview_pipeline`) runs on prompt embeddings (cached, or encoded now with images
given for a family with conditions: `family.preview_inputs`) and calls the same transformer the trainer
trains, so block swapping and the live LoRA apply as they are. LoRA dropout is off (eval mode) while
sampling.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from PIL import Image

from ..core.errors import UserInputError
from ..data.cache import CachedDataset
from ..models.components import QwenImageComponents
from ..models.latents import pixel_multiple
from ..planner.device import preview_decode_in_tiles


class WrappedTransformer(torch.nn.Module):
    """Our transformer as a pinned pipeline calls it with a family's conditions put in (Edit's controls appended,
    2.1's references placed): what the pipeline reads of its transformer (config, blocks, dtype, device, cache
    contexts) is the inner one's; a subclass changes the call (`forward`)."""

    def __init__(self, transformer: torch.nn.Module):
        super().__init__()
        self.inner = transformer

    @property
    def config(self):
        return self.inner.config

    @property
    def transformer_blocks(self):  # (2.1's pipeline keeps a KV cache over them)
        return self.inner.transformer_blocks

    @property
    def dtype(self):
        return self.inner.dtype

    @property
    def device(self):  # the pipeline finds its execution device through its modules' `device`
        return self.inner.device

    def cache_context(self, name: str):
        return self.inner.cache_context(name)


def snap_size(size: int, multiple: int) -> int:
    return max(multiple, size // multiple * multiple)


def prompt_embedding(dataset: CachedDataset, prompt: str) -> torch.Tensor:
    try:
        return dataset.prompt_embedding(prompt)
    except KeyError:
        known = [p for p in dataset.prompt_keys if p]
        raise UserInputError(
            f"preview prompt {prompt!r} was not cached (the text encoder is released after caching). Add it to "
            f"the cache node's preview prompts and queue again. Cached prompts: {known[:8]}"
        ) from None


@torch.no_grad()
def sample_image(
    components: QwenImageComponents,
    dataset: CachedDataset,
    prompt: str,
    negative_prompt: str = "",
    width: int = 1024,
    height: int = 1024,
    steps: int = 20,
    cfg_scale: float = 4.0,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    condition_images: list[Image.Image] | None = None,
) -> Image.Image:
    """One image for `prompt` (true CFG against `negative_prompt` when cfg_scale > 1). `condition_images`:
    for a family with conditions (Edit: 1 to 3 control images to edit), else its default (Edit: the cached
    preview sample's controls)."""
    family = components.family
    steps, cfg_scale, sigmas = family.preview_schedule(components, steps, cfg_scale)
    use_cfg = cfg_scale > 1.0
    conditions, embeds = family.preview_inputs(components, dataset, [prompt, negative_prompt] if use_cfg else [prompt],
                                               condition_images)
    transformer, vae = components.transformer, components.ensure_vae()
    multiple = pixel_multiple(vae)
    width, height = snap_size(width, multiple), snap_size(height, multiple)
    # a decode too large for what the GPU can still give (`planner.device.room_now`: not what torch has reserved,
    # which holds the training state) runs in diffusers' tiles (the memory plan counts the same)
    vae.enable_tiling() if preview_decode_in_tiles(components, width, height) else vae.disable_tiling()
    device, dtype = components.device, components.compute_dtype
    positive = embeds[prompt].unsqueeze(0)  # (1, L, D)
    negative = embeds[negative_prompt].unsqueeze(0) if use_cfg else None

    pipe = family.preview_pipeline(components, conditions)
    pipe.set_progress_bar_config(disable=True)

    def on_step_end(_pipe, i, _t, kwargs):
        if progress is not None:
            progress(i + 1, steps)
        return {}

    was_training = transformer.training
    transformer.eval()
    try:
        image = family.preview_image(pipe, conditions, dict(
            prompt_embeds=positive.to(device, dtype), prompt_embeds_mask=_all_valid(positive, device),
            negative_prompt_embeds=None if negative is None else negative.to(device, dtype),
            negative_prompt_embeds_mask=None if negative is None else _all_valid(negative, device),
            true_cfg_scale=cfg_scale, width=width, height=height, num_inference_steps=steps,
            generator=torch.Generator("cpu").manual_seed(seed), output_type="pil",
            callback_on_step_end=on_step_end, **({"sigmas": list(sigmas)} if sigmas is not None else {}),
        ))
    finally:
        components.park_vae()
        transformer.train(was_training)
    return image


def _all_valid(embeds: torch.Tensor, device) -> torch.Tensor:
    """A (1, L) mask of ones: one unpadded prompt (the pipeline drops an all-ones mask itself)."""
    return torch.ones(embeds.shape[:2], dtype=torch.long, device=device)
