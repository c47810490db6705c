"""The Layered family's preview hooks: `QwenImageLayeredPipeline`'s sampling at the preview's size.

The pipeline's `__call__` sizes its images to about 640² or 1024² px only (an assertion), which a tiny model
on a CPU cannot afford for a preview. So `layer_images` runs the `__call__`'s steps with its own pieces at
the preview size asked for (the composite's aspect ratio kept by the pipeline's `calculate_dimensions`):
its resizing and preprocessing of the RGBA composite, `prepare_latents` (the noise for F = layers + 1
frames and the composite's condition latents), `img_shapes`, sigmas and mu (`retrieve_timesteps`),
`additional_t_cond`, true CFG, `scheduler.step`, `_unpack_latents` and the VAE decoding of every frame but the
composite's. tests/families/test_layered_previews.py checks it equals the pipeline's `__call__` image for image.

Prompts are the cached embeddings: Layered's prompts do not see the image, so a composite given on the
canvas needs no text encoder. The number of layers is the preview sample's (the first training sample), or
LAYERS_DEFAULT for a canvas image without one. The preview image is one sheet: the composite, then each
layer over a checkerboard (transparency visible).
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from ...data.pixels import on_checkerboard
from ..sampling import prompt_embedding
from .cache import layer_count
from .data import open_rgba
from .pipeline import RGB_FLAG, condition_mu, layered_pipeline

LAYERS_DEFAULT = 4  # the pipeline's own default
CHECKER = 16  # px per square of the sheet's checkerboard


def preview_inputs(components, dataset, prompts: list[str], condition_images):
    """((composite RGBA image, layers), {prompt: (L, D) embedding}) for a preview."""
    embeds = {p: prompt_embedding(dataset, p) for p in dict.fromkeys(prompts)}
    if condition_images:
        preview = dataset.preview_sample
        return (condition_images[0].convert("RGBA"), layer_count(preview) if preview else LAYERS_DEFAULT), embeds
    preview = dataset.preview_sample
    return (open_rgba(preview.image_path), layer_count(preview)), embeds


def preview_pipeline(components):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return layered_pipeline(components, transformer=components.transformer, encoder=False,
                            scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config))


@torch.no_grad()
def layer_images(pipe, conditions, call: dict) -> list[Image.Image]:
    """The RGBA layers the pipeline's sampling makes of the composite in `conditions` at about
    call["width"] x call["height"] px of area, with the shared sampler's `call` (module docstring)."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_layered as layered

    composite, layers = conditions
    transformer, scheduler, f = pipe.transformer, pipe.scheduler, pipe.vae_scale_factor
    device, dtype = pipe._execution_device, call["prompt_embeds"].dtype
    width, height = layered.calculate_dimensions(call["width"] * call["height"], composite.width / composite.height)
    width, height = width // (2 * f) * (2 * f), height // (2 * f) * (2 * f)
    image = pipe.image_processor.resize(composite, height, width)
    pixels = pipe.image_processor.preprocess(image, height, width).unsqueeze(2).to(dtype)  # (1, 4, 1, H, W)
    channels = transformer.config.in_channels // 4
    latents, condition = pipe.prepare_latents(pixels, 1, channels, height, width, layers, dtype, device,
                                              call["generator"])  # (1, F * n, 4C), (1, n, 4C)
    img_shapes = [[(1, height // f // 2, width // f // 2)] * (layers + 2)]
    steps = call["num_inference_steps"]
    timesteps, _ = layered.retrieve_timesteps(scheduler, steps, device, sigmas=np.linspace(1.0, 0, steps + 1)[:-1],
                                              mu=condition_mu(condition.shape[1]))
    rgb = torch.full((1,), RGB_FLAG, dtype=torch.long, device=device)
    negative = call["negative_prompt_embeds"]
    use_cfg = call["true_cfg_scale"] > 1 and negative is not None
    scheduler.set_begin_index(0)

    def predict(embeds, mask, t):
        out = transformer(hidden_states=torch.cat([latents, condition], dim=1), timestep=t.expand(1).to(dtype) / 1000,
                          encoder_hidden_states=embeds, encoder_hidden_states_mask=mask, img_shapes=img_shapes,
                          additional_t_cond=rgb, return_dict=False)[0]
        return out[:, : latents.shape[1]]

    for i, t in enumerate(timesteps):
        noise_pred = predict(call["prompt_embeds"], _mask(call["prompt_embeds_mask"]), t)
        if use_cfg:
            negative_pred = predict(negative, _mask(call["negative_prompt_embeds_mask"]), t)
            noise_pred = negative_pred + call["true_cfg_scale"] * (noise_pred - negative_pred)
        latents = scheduler.step(noise_pred, t, latents, return_dict=False)[0]
        if call.get("callback_on_step_end") is not None:
            call["callback_on_step_end"](pipe, i, t, {})
    return _decode_layers(pipe, latents, height, width, layers)


def _mask(mask):
    """The pipeline drops an all-ones mask (`encode_prompt`)."""
    return None if mask is None or mask.all() else mask


def _decode_layers(pipe, latents: torch.Tensor, height: int, width: int, layers: int) -> list[Image.Image]:
    """Packed latents of F frames -> the RGBA images of frames 1..F-1 (frame 0 is the composite again)."""
    vae = pipe.vae
    frames = pipe._unpack_latents(latents, height, width, layers, pipe.vae_scale_factor)  # (1, C, F, h, w)
    frames = frames.to(vae.dtype)
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(frames.device, frames.dtype)
    inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(frames.device, frames.dtype)
    frames = (frames / inverse_std + mean)[:, :, 1:]  # the pipeline's own expression, bit for bit
    c, h, w = frames.shape[1], frames.shape[3], frames.shape[4]
    decoded = vae.decode(frames.permute(0, 2, 1, 3, 4).reshape(-1, c, 1, h, w), return_dict=False)[0][:, :, 0]
    return pipe.image_processor.postprocess(decoded, output_type="pil")


def preview_image(pipe, conditions, call: dict) -> Image.Image:
    layers = layer_images(pipe, conditions, call)
    composite = conditions[0].resize(layers[0].size, Image.Resampling.LANCZOS)
    return layer_sheet([composite, *layers])


def layer_sheet(images: list[Image.Image]) -> Image.Image:
    """RGBA images of one size side by side, each over a checkerboard: one RGB image."""
    w, h = images[0].size
    sheet = Image.new("RGB", (w * len(images), h), "white")
    for i, image in enumerate(images):
        sheet.paste(on_checkerboard(image.convert("RGBA"), CHECKER), (i * w, 0))
    return sheet
