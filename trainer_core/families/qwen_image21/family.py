"""Qwen-Image 2.1 as a model family: what differs from Qwen-Image, behind the seam's hooks.

A sample is a target image and its caption (a text-to-image dataset), or a target, its caption and 1 to 10
reference images (an edit dataset, data/edit_dataset.py's convention: the controls are the references).
One model set trains either: it trains reference-image editing when its dataset has reference images. What
the pinned `QwenImage21Pipeline` feeds its transformer, and so what training feeds it (objective.py):
    hidden_states          [reference tokens | noisy target tokens], one token per latent cell (B, M + N, C)
    encoder_hidden_states  the prompt's Qwen3-VL embedding (B, L, D), seen with the references' vision tokens
                           (text.py alone, references.py with images), right-padded with its mask
    img_mask               (B, L + N / 4): the prompt's image slots (its references'), then the target's
    img_shapes             [[*references, (1, h, w)]] per sample; timestep: the noise level s in (0, 1)
The output covers the whole joint sequence; the loss takes its last N rows, as the pipeline's prediction.

Tensors: latents (C = 64, h, w) per sample (16x VAE: h = H / 16); prompt embeddings (L, D = 4096) with their
image slots (L,) when seen with references; reference latents (C, h_i, w_i).
"""

from __future__ import annotations

import torch

from ...data.demo_shapes import PREVIEW_PROMPT, demo_samples
from ...data.edit_dataset import EDIT, EditDataset, load_edit_dataset
from ...data.images import IMAGES
from ..base import CacheConditioning, DemoSpec, ModelFamily, conditioned_image_size
from .conditioning import NAME, Conditioning21
from .export import export_tiny_qwen_image21
from .objective import transformer_kwargs
from .sampling import preview_inputs, preview_pipeline
from .turbo import TURBO_CFG, TURBO_SIGMAS, is_turbo

# plan.py and tiny.py name diffusers' 2.1 classes (0.42 and later), imported where they are used: the registry imports
# every family package, and the pack's other families run on diffusers 0.37 (requirements.txt's floor).


class QwenImage21(ModelFamily):
    name = NAME
    display_name = "Qwen-Image 2.1"
    weights_licence = "Qwen Research License (non-commercial)"
    dataset_kinds = (IMAGES, EDIT)  # text-to-image, or editing with the controls as its references
    patch_size = 1  # the transformer takes latent cells unpacked (its config's patch_size 1)
    keeps_transparency = True  # its VAE encodes RGBA: transparent images train as they are (conditioning.py)

    # data and cache

    def load_dataset(self, cfg, settings=None):
        """A run file's dataset folder: with [edit] (`settings` its EditDataConfig) an edit dataset, as the Edit
        Dataset node finds it (the controls are the references), else a text-to-image one, as the Dataset node."""
        if settings is None:
            return super().load_dataset(cfg)
        return load_edit_dataset(cfg, settings)

    def data_settings(self, dataset):
        return dataset.edit if isinstance(dataset, EditDataset) else None

    def cache_conditioning(self, components, samples, settings) -> CacheConditioning:
        self.check_samples(samples)
        return Conditioning21(components, samples, getattr(settings, "control_resolution", 0) or 0)

    # training step

    def batch_group(self, sample):
        """Samples of one micro-batch share the target's bucket and the references' sizes (they are stacked, and
        the transformer reads one layout of image slots)."""
        return (sample.bucket, sample.condition_sizes)

    def dropped_text_key(self, dataset, sample) -> str:
        """The empty caption seen with the sample's own references (caption dropout keeps the images)."""
        return sample.empty_text_key if sample.condition_keys else dataset.prompt_keys[""]

    def conditions(self, dataset, samples):
        if not any(s.condition_keys for s in samples):
            return None
        return [[dataset.latents(k).float() for k in s.condition_keys] for s in samples]

    def transformer_kwargs(self, hidden, grid, conditions, text, text_mask, text_keys=None, dataset=None):
        slots = None
        if conditions:
            if text_keys is None or dataset is None:
                raise ValueError("Qwen-Image 2.1 with reference images needs the prompts' cache keys (image slots)")
            slots = [dataset.text_tensor(k, "image_slots") for k in text_keys]
        return transformer_kwargs(hidden, grid, text, text_mask, conditions, slots)

    def target_prediction(self, output, grid):
        return output[:, -grid[0] * grid[1]:]  # the target's tokens close the joint sequence

    # memory plan

    def planned_image_size(self, dataset):
        return conditioned_image_size(dataset)  # reference tokens lengthen the image sequence as target tokens do

    def planned_arch(self):
        from .plan import real_arch21
        return real_arch21()

    def planned_parts(self, text_encoder_file=True):
        from .plan import real_parts21
        return real_parts21(lm_head=not text_encoder_file)  # ComfyUI's file drops the head (text_file.py)

    def planned_caption_parts(self):
        from .plan import real_parts21
        return real_parts21(lm_head=True)  # Qwen3-VL-8B whole: the captioner keeps the file's head

    # previews

    def takes_condition_images(self, dataset) -> bool:
        """It edits when its dataset has reference images (an edit dataset: its preview sample has some)."""
        sample = dataset.preview_sample
        return sample is not None and bool(sample.condition_keys)

    def preview_inputs(self, components, dataset, prompts, condition_images):
        return preview_inputs(components, dataset, prompts, condition_images)

    def preview_pipeline(self, components, conditions):
        return preview_pipeline(components, conditions)

    def describe(self, components):
        if is_turbo(components):
            return (f"{self.display_name} Turbo (previews sample on its {len(TURBO_SIGMAS)} sigmas at CFG {TURBO_CFG:g}, "
                    "whatever the preview settings' steps and CFG)")
        return self.display_name

    def preview_schedule(self, components, steps, cfg_scale):
        if is_turbo(components):  # its template's 8 sigmas at CFG 1, whatever the preview settings say (turbo.py)
            return len(TURBO_SIGMAS), TURBO_CFG, TURBO_SIGMAS
        return steps, cfg_scale, None

    # built-ins

    def tiny_components(self, seed=0, storage="float32", compute_dtype=None, device="cpu"):
        from .tiny import build_tiny_qwen_image21_set
        return build_tiny_qwen_image21_set(self, seed=seed, storage=storage,
                                           compute_dtype=compute_dtype or torch.float32, device=device)

    def demo(self) -> DemoSpec:
        return DemoSpec(run_name="demo-qwen-image-2.1", lora_name="demo_qwen_image21_lora.safetensors",
                        preview_prompt=PREVIEW_PROMPT, plot_title="qwen-image-2.1 demo loss", make_dataset=demo_samples)

    def export_tiny(self, folder, layout="comfyui", seed=0, name=None):
        return export_tiny_qwen_image21(self.tiny_components(seed=seed), folder, layout)


QWEN_IMAGE21 = QwenImage21()
FAMILIES = {NAME: QWEN_IMAGE21}
