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

from ...core.errors import UserInputError
from ..base import CacheConditioning, DemoSpec, ModelFamily

NAME = "qwen-image-layered"


class QwenImageLayered(ModelFamily):
    name = NAME

    # data and cache

    def load_dataset(self, cfg, settings=None):
        from .data import load_layered_dataset

        return load_layered_dataset(cfg)

    def check_samples(self, samples) -> None:
        from .data import LayeredSample

        missing = [s for s in samples if not (isinstance(s, LayeredSample) and s.layers)]
        if missing:
            raise UserInputError(f"image {Path(missing[0].image_path).name} has no layers: a Qwen-Image-Layered model "
                                 "trains on a layered dataset (the composite name.png with name_layer_1.png, "
                                 "name_layer_2.png, ... beside it; the Layered Dataset node).")

    def cache_conditioning(self, components, samples, settings) -> CacheConditioning:
        from .cache import LayeredConditioning

        self.check_samples(samples)
        return LayeredConditioning(components)

    # training step

    def batch_group(self, sample):
        """Samples of one micro-batch share the bucket and the number of layers (their frames are stacked)."""
        from .cache import layer_count

        return (sample.bucket, layer_count(sample))

    def conditions(self, dataset, samples):
        """The composite's clean latents (C, h, w): frame 0 of each target entry (cache.py)."""
        return [[dataset.latents(s.latent_key)[:, 0].float()] for s in samples]

    def token_grid(self, latent_shape):
        from .pipeline import frame_grid

        return frame_grid(latent_shape)  # (F, h/2, w/2)

    def pack(self, latents):
        from .pipeline import pack_frames

        return pack_frames(latents)

    def resolution_mu(self, latent_shape, scheduler_config):
        from .pipeline import condition_mu

        _, gh, gw = self.token_grid(latent_shape)
        return condition_mu(gh * gw)

    def extra_transformer_kwargs(self, batch, device):
        import torch

        from .pipeline import RGB_FLAG

        return {"additional_t_cond": torch.full((batch,), RGB_FLAG, dtype=torch.long, device=device)}

    def transformer_inputs(self, hidden, grid, conditions):
        import torch

        from ...models.latents import pack_latents
        from .pipeline import frame_shapes

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
        from .cache import layer_count

        largest = max(dataset.samples, key=lambda s: s.bucket[0] * s.bucket[1] * (layer_count(s) + 2))
        return largest.bucket[0], largest.bucket[1] * (layer_count(largest) + 2)

    # previews

    def preview_inputs(self, components, dataset, prompts, condition_images):
        from .sampling import preview_inputs

        return preview_inputs(components, dataset, prompts, condition_images)

    def preview_pipeline(self, components, conditions):
        from .sampling import preview_pipeline

        return preview_pipeline(components)

    def preview_image(self, pipe, conditions, call):
        from .sampling import preview_image

        return preview_image(pipe, conditions, call)

    # built-ins

    def tiny_components(self, seed=0, storage="float32", compute_dtype=None, device="cpu"):
        import torch

        from .tiny import build_tiny_layered_components

        return build_tiny_layered_components(seed=seed, storage=storage, compute_dtype=compute_dtype or torch.float32,
                                             device=device)

    def demo(self) -> DemoSpec:
        from . import demo

        return DemoSpec(run_name=demo.RUN_NAME, lora_name=demo.LORA_NAME, preview_prompt=demo.PREVIEW_PROMPT,
                        plot_title=f"{NAME} demo loss", make_dataset=demo.demo_samples)


QWEN_IMAGE_LAYERED = QwenImageLayered()
