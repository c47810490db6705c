"""Qwen-Image-Edit (Edit, Edit-2509, Edit-2511) as a model family: one instance per variant.

A sample is a target, its caption (the edit instruction) and 1 to 3 control images. What the shared engine
asks of this family, and where the answer lives in this package:
    data, cache       data.py (the folder convention), cache.py (control latents, image-conditioned prompts)
    training step     objective.py (control tokens after the target's; the loss on the target's tokens)
    memory plan       objective.planned_image_size (control tokens lengthen the image sequence)
    previews          sampling.py (the text-to-image pipeline around a transformer that appends the controls)
    built-ins         tiny.py, demo.py
Loading (files.py, variants.py) sets the family of the model set it builds.

Tensors: control latents (C, h_i, w_i) per control; hidden (B, N + M, 4C) with M the controls' tokens.
"""

from __future__ import annotations

from pathlib import Path

from ...core.errors import UserInputError
from ..base import CacheConditioning, DemoSpec, ModelFamily
from .variants import EDIT_VARIANTS, EditVariant


class QwenImageEdit(ModelFamily):
    def __init__(self, variant: EditVariant):
        self.variant = variant
        self.name = variant.name

    # data and cache

    def load_dataset(self, cfg, settings=None):
        """The edit dataset convention (the Edit Dataset node's): `settings` an EditDataConfig (a run file's [edit]
        control_resolution), None: the model's own rule."""
        from .data import load_edit_dataset

        return load_edit_dataset(cfg, settings)

    def check_samples(self, samples) -> None:
        from .data import EditSample

        missing = [s for s in samples if not (isinstance(s, EditSample) and s.controls)]
        if missing:
            raise UserInputError(f"image {Path(missing[0].image_path).name} has no control images: an edit model trains "
                                 "on an edit dataset (the Edit Dataset node).")

    def data_settings(self, dataset):
        from .config import EditDataConfig
        from .data import EditDataset

        return dataset.edit if isinstance(dataset, EditDataset) else EditDataConfig()

    def cache_conditioning(self, components, samples, settings) -> CacheConditioning:
        from .cache import EditConditioning

        self.check_samples(samples)
        return EditConditioning(components, self.variant, samples, settings.control_resolution if settings else 0)

    # training step

    def batch_group(self, sample):
        """Samples of one micro-batch share the target's bucket and the controls' sizes (they are stacked)."""
        return (sample.bucket, sample.condition_sizes)

    def dropped_text_key(self, dataset, sample) -> str:
        """The empty caption seen with the sample's own control images (caption dropout keeps the images)."""
        return sample.empty_text_key

    def conditions(self, dataset, samples):
        return [[dataset.latents(k).float() for k in s.condition_keys] for s in samples]

    def transformer_inputs(self, hidden, grid, conditions):
        from .objective import append_controls

        return append_controls(hidden, grid, conditions)  # (B, N + M, 4C), one img_shapes entry per image

    # memory plan

    def planned_image_size(self, dataset):
        from .objective import planned_image_size

        return planned_image_size(dataset)

    def planned_vision_sizes(self, dataset):
        """The planned sample's control images as the text encoder's vision tower sees them (Edit-Plus: about
        384² px at the model's rule; Edit: the VAE's size), on the processor's 28 px grid: from the cached VAE
        sizes (the cache keeps no control_resolution), see `pipelines.encoder_view`."""
        from .objective import largest_sample
        from .pipelines import encoder_view, processor_view

        return tuple(processor_view(encoder_view(self.variant, size)) for size in largest_sample(dataset).condition_sizes)

    # previews

    def preview_inputs(self, components, dataset, prompts, condition_images):
        from .sampling import preview_inputs

        return preview_inputs(self.variant, components, dataset, prompts, condition_images)

    def preview_pipeline(self, components, conditions):
        from .sampling import preview_pipeline

        return preview_pipeline(components, conditions)

    # built-ins

    def tiny_components(self, seed=0, storage="float32", compute_dtype=None, device="cpu"):
        import torch

        from .tiny import build_tiny_edit_components

        return build_tiny_edit_components(self.name, seed=seed, storage=storage,
                                          compute_dtype=compute_dtype or torch.float32, device=device)

    def demo(self) -> DemoSpec:
        from . import demo

        controls = min(2, self.variant.max_controls)
        return DemoSpec(run_name=demo.RUN_NAME, lora_name=demo.LORA_NAME, preview_prompt=demo.PREVIEW_PROMPT,
                        plot_title=f"{self.name} demo loss",
                        make_dataset=lambda folder: demo.demo_samples(folder, controls))


EDIT_FAMILIES = {name: QwenImageEdit(variant) for name, variant in EDIT_VARIANTS.items()}


def edit_family(variant: EditVariant) -> QwenImageEdit:
    return EDIT_FAMILIES[variant.name]
