"""Layered previews: the shared sampler (families/sampling.sample_image) on the tiny Layered model with a
trained LoRA equals `QwenImageLayeredPipeline.__call__` with the same LoRA, noise and settings, layer for layer.

The pipeline sizes its images to about 640² or 1024² px only; the test runs it at the preview's size by
setting its module's `calculate_dimensions` (what it sizes with), which our sampler calls as well.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from test_layered import layered_data, layered_trainer  # noqa: F401 (fixtures)
from trainer_core.families.qwen_image_layered.sampling import layer_sheet
from trainer_core.families.sampling import sample_image
from trainer_core.models.text import template_prefix_length

SIZE = 64


def test_preview_equals_the_pipelines_own_sampling_with_the_same_lora(layered_trainer, monkeypatch):
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImageLayeredPipeline
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_layered as layered

    monkeypatch.setattr(layered, "calculate_dimensions", lambda area, ratio: (SIZE, SIZE))
    trainer = layered_trainer
    components, dataset = trainer.components, trainer.dataset
    prompt = dataset.preview_sample.caption
    ours = sample_image(components, dataset, prompt, negative_prompt="", width=SIZE, height=SIZE, steps=3,
                        cfg_scale=2.5, seed=5)

    components.ensure_text_encoder()
    transformer = components.transformer
    pipe = QwenImageLayeredPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config), vae=components.ensure_vae(),
        text_encoder=components.text_encoder, tokenizer=components.tokenizer, processor=None, transformer=transformer)
    pipe.prompt_template_encode_start_idx = template_prefix_length(components.tokenizer, pipe.prompt_template_encode)
    pipe.set_progress_bar_config(disable=True)
    composite = Image.open(dataset.preview_sample.image_path).convert("RGBA")
    was_training = transformer.training
    transformer.eval()
    try:
        layers = pipe(image=composite, prompt=prompt, negative_prompt="", true_cfg_scale=2.5, layers=2,
                      num_inference_steps=3, generator=torch.Generator("cpu").manual_seed(5), resolution=640).images[0]
    finally:
        transformer.train(was_training)
        components.release_text_encoder()
    assert len(layers) == 2 and layers[0].mode == "RGBA"
    expected = layer_sheet([composite.resize(layers[0].size, Image.Resampling.LANCZOS), *layers])
    assert ours.size == expected.size == (3 * SIZE, SIZE)
    assert np.array_equal(np.asarray(ours), np.asarray(expected))
