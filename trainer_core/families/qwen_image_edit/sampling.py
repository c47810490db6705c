"""The Edit family's preview hooks: what the shared sampler (sampling.sample_image) samples an edit with.

The edit pipelines' denoising loop is the text-to-image pipeline's (same schedule from the target's token
count, same true CFG with its norm rescale), plus three things around each transformer call: the control
tokens appended after the target's, their `img_shapes` entries, and the output cut back to the target's
tokens (`noise_pred[:, : latents.size(1)]`). `ControlledTransformer` does exactly these three around our
transformer, so the pinned `QwenImagePipeline` samples an edit from cached control latents and prompt
embeddings, without the text encoder and without encoding the controls again.

Controls come from a training sample (the cached preview sample's, by default) or from images given now
(the canvas): those are encoded on the spot, the text encoder brought back for it and released after
(`preview_inputs`); `preview_pipeline` is the pinned `QwenImagePipeline` around `ControlledTransformer`.
"""

from __future__ import annotations

import torch
from PIL import Image

from ...core.errors import UserInputError
from ..sampling import WrappedTransformer, prompt_embedding
from .objective import append_controls
from .variants import more_controls
from .pipelines import (
    check_control_aspect,
    control_size,
    edit_pipeline,
    encode_control_latents,
    encode_edit_prompt,
    prepare_control,
)


class ControlledTransformer(WrappedTransformer):
    """`transformer` with fixed control latents appended to every call's image tokens (module docstring)."""

    def __init__(self, transformer: torch.nn.Module, controls: list[torch.Tensor]):
        super().__init__(transformer)
        self.controls = controls  # [(C, h_i, w_i)]

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
    for n, img in enumerate(images, 1):  # refused by number before anything loads, as the cache refuses a file
        size = control_size(variant, img.width, img.height, control_resolution)
        check_control_aspect(f"{n} (wired into the preview)", img.width, img.height, size, control_resolution)
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


def preview_inputs(variant, components, dataset, prompts: list[str], control_images: list[Image.Image] | None
                   ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """(control latents [(C, h_i, w_i)], {prompt: (L, D) embedding}): of `control_images` (1 to the variant's
    maximum, encoded now) or else the cached preview sample's controls (cache.py) and its cached prompts."""
    if control_images:
        if len(control_images) > variant.max_controls:
            raise UserInputError(f"{len(control_images)} control images were given, but {variant.name} takes at most "
                                 f"{variant.max_controls}: give fewer, or {more_controls(len(control_images))}.")
        settings = dataset.settings
        return encode_given_controls(components, variant, control_images, prompts,
                                     (settings.control_resolution if settings is not None else 0) or None)
    controls = [dataset.latents(k).float() for k in dataset.preview_sample.condition_keys]
    return controls, {p: prompt_embedding(dataset, p) for p in dict.fromkeys(prompts)}


def preview_pipeline(components, controls: list[torch.Tensor]):
    """The pinned text-to-image pipeline around `ControlledTransformer` (module docstring)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    device, dtype = components.device, components.compute_dtype
    controlled = ControlledTransformer(components.transformer, [c.to(device, dtype) for c in controls])
    return QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config),
                             vae=components.vae, text_encoder=None, tokenizer=None, transformer=controlled)
