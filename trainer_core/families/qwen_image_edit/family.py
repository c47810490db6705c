"""Qwen-Image-Edit (Edit, Edit-2509, Edit-2511) as a model family: one instance per variant.

A sample is a target, its caption (the edit instruction) and 1 to 3 control images (data/edit_dataset.py's
convention). What the shared engine asks of this family, and where the answer lives in this package:
    data, cache       cache.py (control latents, image-conditioned prompts)
    training step     objective.py (control tokens after the target's; the loss on the target's tokens)
    memory plan       families.base.conditioned_image_size (control tokens lengthen the image sequence)
    previews          sampling.py (the text-to-image pipeline around a transformer that appends the controls)
    built-ins         tiny.py, demo.py
Loading (loading.py, files.py, variants.py) builds model sets of these families.

Tensors: control latents (C, h_i, w_i) per control; hidden (B, N + M, 4C) with M the controls' tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...core.config import EditDataConfig
from ...core.errors import UserInputError
from ...data.edit_dataset import EDIT, EditDataset, EditSample, load_edit_dataset
from ..base import CacheConditioning, DemoSpec, ModelFamily, conditioned_image_size, largest_conditioned_sample
from . import demo
from .cache import EditConditioning
from .export import export_tiny_edit
from .objective import append_controls
from .pipelines import encoder_view, processor_view
from .sampling import preview_inputs, preview_pipeline
from .tiny import build_tiny_edit_model_set
from .variants import EDIT_VARIANTS, EditVariant

DISPLAY_NAMES = {"edit": "Qwen-Image-Edit", "edit-2509": "Qwen-Image-Edit-2509", "edit-2511": "Qwen-Image-Edit-2511"}


class QwenImageEdit(ModelFamily):
    dataset_kinds = (EDIT,)
    previews_take_condition_images = True

    def __init__(self, variant: EditVariant):
        self.variant = variant
        self.name = variant.name
        self.display_name = DISPLAY_NAMES[variant.name]

    # data and cache

    def load_dataset(self, cfg, settings=None):
        """The edit dataset convention (the Edit Dataset node's): `settings` an EditDataConfig (a run file's [edit]
        control_resolution), None: the model's own rule."""
        return load_edit_dataset(cfg, settings)

    def check_samples(self, samples) -> None:
        missing = [s for s in samples if not (isinstance(s, EditSample) and s.controls)]
        if missing:
            raise UserInputError(f"image {Path(missing[0].image_path).name} has no control images: an edit model trains "
                                 "on an edit dataset (the Edit Dataset node).")

    def data_settings(self, dataset):
        return dataset.edit if isinstance(dataset, EditDataset) else EditDataConfig()

    def cache_conditioning(self, components, samples, settings) -> CacheConditioning:
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
        return append_controls(hidden, grid, conditions)  # (B, N + M, 4C), one img_shapes entry per image

    # memory plan

    def planned_image_size(self, dataset):
        return conditioned_image_size(dataset)

    def planned_vision_sizes(self, dataset):
        """The planned sample's control images as the text encoder's vision tower sees them (Edit-Plus: about
        384² px at the model's rule; Edit: the VAE's size), on the processor's 28 px grid: from the cached VAE
        sizes (the cache keeps no control_resolution), see `pipelines.encoder_view`."""
        return tuple(processor_view(encoder_view(self.variant, size))
                     for size in largest_conditioned_sample(dataset).condition_sizes)

    # previews

    def preview_inputs(self, components, dataset, prompts, condition_images):
        return preview_inputs(self.variant, components, dataset, prompts, condition_images)

    def preview_pipeline(self, components, conditions):
        return preview_pipeline(components, conditions)

    # built-ins

    def tiny_components(self, seed=0, storage="float32", compute_dtype=None, device="cpu"):
        return build_tiny_edit_model_set(self, seed=seed, storage=storage, compute_dtype=compute_dtype or torch.float32,
                                         device=device)

    def demo(self) -> DemoSpec:
        controls = min(2, self.variant.max_controls)
        return DemoSpec(run_name=demo.RUN_NAME, lora_name=demo.LORA_NAME, preview_prompt=demo.PREVIEW_PROMPT,
                        plot_title=f"{self.name} demo loss",
                        make_dataset=lambda folder: demo.demo_samples(folder, controls))

    def export_tiny(self, folder, layout="comfyui", seed=0, name=None):
        return export_tiny_edit(self.tiny_components(seed=seed), folder, layout)


FAMILIES = {name: QwenImageEdit(variant) for name, variant in EDIT_VARIANTS.items()}
