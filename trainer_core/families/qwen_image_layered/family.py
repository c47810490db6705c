"""Qwen-Image-Layered (RGBA layer decomposition) as a model family.

A sample is a composite image, its caption and its RGBA layers (data.py). What the model learns, as
`QwenImageLayeredPipeline` conditions it (pipeline.py): from noise, the composite again and each layer, as
F = layers + 1 frames, seeing the composite's clean latents as a condition image after them. The loss covers
every frame the pipeline predicts (the composite frame too: the pipeline's sampler steps all of them).

Tensors: target latents (C, F, h, w) per sample, (B, C, F, h, w) stacked; packed tokens (B, F * n, 4C) with
n = h/2 * w/2; the condition's n tokens after them: hidden (B, (F + 1) * n, 4C).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...core.errors import UserInputError
from ...models.latents import pack_latents
from ..base import CacheConditioning, DemoSpec, ModelFamily
from . import demo
from .cache import LayeredConditioning, layer_count
from .data import LAYERED, LayeredSample, load_layered_dataset
from .export import export_tiny_layered
from .pipeline import RGB_FLAG, condition_mu, frame_grid, frame_shapes, pack_frames
from .sampling import preview_image, preview_inputs, preview_pipeline
from .tiny import build_tiny_layered_model_set

NAME = "qwen-image-layered"


class QwenImageLayered(ModelFamily):
    name = NAME
    display_name = "Qwen-Image-Layered"
    dataset_kinds = (LAYERED,)
    keeps_transparency = True  # its VAE is RGBA and its samples keep their alpha always (data.py)

    # data and cache

    def load_dataset(self, cfg, settings=None):
        return load_layered_dataset(cfg)

    def check_samples(self, samples) -> None:
        missing = [s for s in samples if not (isinstance(s, LayeredSample) and s.layers)]
        if missing:
            raise UserInputError(f"image {Path(missing[0].image_path).name} has no layers: a Qwen-Image-Layered model "
                                 "trains on a layered dataset (the composite name.png with name_layer_1.png, "
                                 "name_layer_2.png, ... beside it; the Layered Dataset node).")

    def cache_conditioning(self, components, samples, settings) -> CacheConditioning:
        self.check_samples(samples)
        return LayeredConditioning(components)

    # training step

    def batch_group(self, sample):
        """Samples of one micro-batch share the bucket and the number of layers (their frames are stacked)."""
        return (sample.bucket, layer_count(sample))

    def conditions(self, dataset, samples):
        """The composite's clean latents (C, h, w): frame 0 of each target entry (cache.py)."""
        return [[dataset.latents(s.latent_key)[:, 0].float()] for s in samples]

    def token_grid(self, latent_shape):
        return frame_grid(latent_shape)  # (F, h/2, w/2)

    def pack(self, latents):
        return pack_frames(latents)

    def resolution_mu(self, latent_shape, scheduler_config):
        _, gh, gw = self.token_grid(latent_shape)
        return condition_mu(gh * gw)

    def extra_transformer_kwargs(self, batch, device):
        return {"additional_t_cond": torch.full((batch,), RGB_FLAG, dtype=torch.long, device=device)}

    def transformer_inputs(self, hidden, grid, conditions):
        frames, gh, gw = grid
        condition = torch.cat([pack_latents(c[0].unsqueeze(0)) for c in conditions])  # (B, n, 4C)
        hidden = torch.cat([hidden, condition.to(hidden.device, hidden.dtype)], dim=1)  # (B, (F + 1) n, 4C)
        return hidden, [frame_shapes(frames, (gh, gw))] * hidden.shape[0]

    def loss_tokens(self, grid):
        frames, gh, gw = grid
        return frames * gh * gw

    # memory plan

    def planned_image_size(self, dataset):
        """The largest bucket with F + 1 images' rows (the frames and the condition lengthen the sequence)."""
        largest = max(dataset.samples, key=lambda s: s.bucket[0] * s.bucket[1] * (layer_count(s) + 2))
        return largest.bucket[0], largest.bucket[1] * (layer_count(largest) + 2)

    # previews

    def preview_inputs(self, components, dataset, prompts, condition_images):
        return preview_inputs(components, dataset, prompts, condition_images)

    def preview_pipeline(self, components, conditions):
        return preview_pipeline(components)

    def preview_image(self, pipe, conditions, call):
        return preview_image(pipe, conditions, call)

    # built-ins

    def tiny_components(self, seed=0, storage="float32", compute_dtype=None, device="cpu"):
        return build_tiny_layered_model_set(self, seed=seed, storage=storage,
                                            compute_dtype=compute_dtype or torch.float32, device=device)

    def demo(self) -> DemoSpec:
        return DemoSpec(run_name=demo.RUN_NAME, lora_name=demo.LORA_NAME, preview_prompt=demo.PREVIEW_PROMPT,
                        plot_title=f"{NAME} demo loss", make_dataset=demo.demo_samples)

    def export_tiny(self, folder, layout="comfyui", seed=0, name=None):
        return export_tiny_layered(self.tiny_components(seed=seed), folder, layout)


QWEN_IMAGE_LAYERED = QwenImageLayered()
FAMILIES = {NAME: QWEN_IMAGE_LAYERED}
