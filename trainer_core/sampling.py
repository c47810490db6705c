"""Preview images from the adapter as it is now, with the diffusers Qwen-Image pipeline.

The pipeline runs on cached prompt embeddings (the text encoder is gone by now) and calls the same
transformer the trainer trains, so block swapping and the live LoRA apply as they are. LoRA dropout
is off (eval mode) while sampling.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from PIL import Image

from .cache import CachedDataset
from .errors import UserInputError
from .models.components import QwenImageComponents
from .models.latents import pixel_multiple


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
) -> Image.Image:
    """One image for `prompt` (true CFG against `negative_prompt` when cfg_scale > 1)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    transformer, vae = components.transformer, components.ensure_vae()
    multiple = pixel_multiple(vae)
    width, height = snap_size(width, multiple), snap_size(height, multiple)
    device, dtype = components.device, components.compute_dtype
    positive = prompt_embedding(dataset, prompt).unsqueeze(0)  # (1, L, D)
    use_cfg = cfg_scale > 1.0
    negative = prompt_embedding(dataset, negative_prompt).unsqueeze(0) if use_cfg else None

    pipe = QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config),
        vae=vae, text_encoder=None, tokenizer=None, transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)

    def on_step_end(_pipe, i, _t, kwargs):
        if progress is not None:
            progress(i + 1, steps)
        return {}

    was_training = transformer.training
    transformer.eval()
    try:
        image = pipe(
            prompt_embeds=positive.to(device, dtype), prompt_embeds_mask=_all_valid(positive),
            negative_prompt_embeds=None if negative is None else negative.to(device, dtype),
            negative_prompt_embeds_mask=None if negative is None else _all_valid(negative),
            true_cfg_scale=cfg_scale, width=width, height=height, num_inference_steps=steps,
            generator=torch.Generator("cpu").manual_seed(seed), output_type="pil",
            callback_on_step_end=on_step_end,
        ).images[0]
    finally:
        components.park_vae()
        transformer.train(was_training)
    return image


def _all_valid(embeds: torch.Tensor) -> torch.Tensor:
    """A (1, L) mask of ones: one unpadded prompt (the pipeline drops an all-ones mask itself)."""
    return torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
