"""Preview sampling of an edit with the adapter as it is now.

The edit pipelines' denoising loop is the text-to-image pipeline's (same schedule from the target's token
count, same true CFG with its norm rescale), plus three things around each transformer call: the control
tokens appended after the target's, their `img_shapes` entries, and the output cut back to the target's
tokens (`noise_pred[:, : latents.size(1)]`). `ControlledTransformer` does exactly these three around our
transformer, so the pinned `QwenImagePipeline` samples an edit from cached control latents and prompt
embeddings, without the text encoder and without encoding the controls again.

Controls come from a training sample (the cached preview sample's, by default) or from images given now
(the canvas): those are encoded on the spot, the text encoder brought back for it and released after.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image

from ...models.latents import pixel_multiple
from ...sampling import prompt_embedding, snap_size
from .objective import append_controls
from .pipelines import edit_pipeline, encode_control_latents, encode_edit_prompt, prepare_control


class ControlledTransformer(torch.nn.Module):
    """`transformer` with fixed control latents appended to every call's image tokens (module docstring)."""

    def __init__(self, transformer: torch.nn.Module, controls: list[torch.Tensor]):
        super().__init__()
        self.inner = transformer
        self.controls = controls  # [(C, h_i, w_i)]

    @property
    def config(self):
        return self.inner.config

    @property
    def dtype(self):
        return self.inner.dtype

    @property
    def device(self):  # the pipeline finds its execution device through its modules' `device`
        return self.inner.device

    def cache_context(self, name: str):
        return self.inner.cache_context(name)

    def forward(self, hidden_states: torch.Tensor, img_shapes, return_dict: bool = False, **kwargs):
        n = hidden_states.shape[1]
        grid = tuple(img_shapes[0][0][1:])
        hidden, shapes = append_controls(hidden_states, grid, [self.controls] * hidden_states.shape[0])
        out = self.inner(hidden_states=hidden, img_shapes=shapes, return_dict=False, **kwargs)[0]
        return (out[:, :n],)


@torch.no_grad()
def encode_given_controls(components, variant, images: list[Image.Image], prompts: list[str],
                          control_resolution: int | None) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Control latents of `images` and each prompt's embedding with them (for controls from the canvas)."""
    components.ensure_vae()
    components.ensure_text_encoder()
    try:
        pipe = edit_pipeline(variant, components)
        prepared = [prepare_control(variant, pipe, img.convert("RGB"), control_resolution) for img in images]
        latents = [encode_control_latents(pipe, p.pixels, components.compute_dtype) for p in prepared]
        conditions = [p.condition for p in prepared]
        embeds = {p: encode_edit_prompt(variant, pipe, p, conditions, components.device) for p in dict.fromkeys(prompts)}
    finally:
        components.release_text_encoder()
        components.park_vae()
    return latents, embeds


@torch.no_grad()
def sample_edit_image(components, dataset, prompt: str, negative_prompt: str = "", width: int = 1024,
                      height: int = 1024, steps: int = 20, cfg_scale: float = 4.0, seed: int = 0,
                      progress: Callable[[int, int], None] | None = None,
                      control_images: list[Image.Image] | None = None) -> Image.Image:
    """One edited image for `prompt`: with `control_images` (1 to the variant's maximum) or else the cached
    preview sample's controls (edit/cache.py) and its cached prompts."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    from ...errors import UserInputError

    variant = components.edit
    use_cfg = cfg_scale > 1.0
    if control_images:
        if len(control_images) > variant.max_controls:
            raise UserInputError(f"{len(control_images)} control images were given, but {variant.name} takes at most "
                                 f"{variant.max_controls}.")
        controls, embeds = encode_given_controls(components, variant, control_images,
                                                 [prompt, negative_prompt] if use_cfg else [prompt],
                                                 dataset.control_resolution or None)
        positive, negative = embeds[prompt], embeds.get(negative_prompt) if use_cfg else None
    else:
        sample = dataset.preview_sample
        controls = [dataset.latents(k).float() for k in sample.control_keys]
        positive = prompt_embedding(dataset, prompt)
        negative = prompt_embedding(dataset, negative_prompt) if use_cfg else None
    transformer, vae = components.transformer, components.ensure_vae()
    multiple = pixel_multiple(vae)
    width, height = snap_size(width, multiple), snap_size(height, multiple)
    device, dtype = components.device, components.compute_dtype
    controlled = ControlledTransformer(transformer, [c.to(device, dtype) for c in controls])
    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config),
                             vae=vae, text_encoder=None, tokenizer=None, transformer=controlled)
    pipe.set_progress_bar_config(disable=True)

    def on_step_end(_pipe, i, _t, kwargs):
        if progress is not None:
            progress(i + 1, steps)
        return {}

    def ones(e):  # one unpadded prompt: a mask of ones (the pipeline drops it)
        return torch.ones((1, e.shape[0]), dtype=torch.long, device=device)

    was_training = transformer.training
    transformer.eval()
    vae.to(device)
    try:
        return pipe(
            prompt_embeds=positive.unsqueeze(0).to(device, dtype), prompt_embeds_mask=ones(positive),
            negative_prompt_embeds=None if negative is None else negative.unsqueeze(0).to(device, dtype),
            negative_prompt_embeds_mask=None if negative is None else ones(negative),
            true_cfg_scale=cfg_scale, width=width, height=height, num_inference_steps=steps,
            generator=torch.Generator("cpu").manual_seed(seed), output_type="pil", callback_on_step_end=on_step_end,
        ).images[0]
    finally:
        components.park_vae()
        transformer.train(was_training)


def preview_control_names(dataset) -> list[str]:
    """The file names of the controls a preview uses by default (for status text)."""
    sample = getattr(dataset, "preview_sample", None)
    return [Path(p).name for p in sample.control_paths] if sample is not None else []
