"""Qwen-Image-Edit inputs against the pinned diffusers edit pipelines themselves.

Each test runs the real `QwenImageEditPipeline` / `QwenImageEditPlusPipeline` for one step on tiny parts and
captures what it hands the transformer, then makes the same inputs with our engine from the same images:
prompt embeddings with images, packed control latents and `img_shapes` must be exactly equal.

The pipelines size controls to ~1024² px (a ~10 s VAE encode for the tiny VAE on a CPU). The tests shrink the
area the pipelines ask for (Edit-Plus: its module's VAE_IMAGE_SIZE and CONDITION_IMAGE_SIZE; Edit: the
1024 * 1024 its `__call__` passes to `calculate_dimensions`); our engine reads those same constants, so it
follows without being told, which also proves it reads them rather than retyping them.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image, ImageDraw

from trainer_core.families.qwen_image_edit.objective import append_controls
from trainer_core.families.qwen_image_edit.pipelines import (
    edit_pipeline, encode_control_latents, encode_edit_prompt, prepare_control,
)
from trainer_core.families.qwen_image_edit.tiny import build_tiny_edit_components
from trainer_core.families.qwen_image_edit.variants import get_variant
from trainer_core.models.latents import pack_latents
from trainer_core.models.text import template_prefix_length

SMALL_VAE_AREA = 128 * 128
SMALL_CONDITION_AREA = 48 * 48


@pytest.fixture
def small_pipeline_sizes(monkeypatch):
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as v1
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

    monkeypatch.setattr(plus, "VAE_IMAGE_SIZE", SMALL_VAE_AREA)
    monkeypatch.setattr(plus, "CONDITION_IMAGE_SIZE", SMALL_CONDITION_AREA)
    original = v1.calculate_dimensions
    monkeypatch.setattr(v1, "calculate_dimensions",
                        lambda area, ratio: original(SMALL_VAE_AREA if area == 1024 * 1024 else area, ratio))


def control_images() -> list[Image.Image]:
    """Three controls of different aspect ratios (the Plus pipeline sizes each alone)."""
    out = []
    for i, (size, colour) in enumerate((((96, 64), "red"), ((64, 64), "blue"), ((48, 80), "green"))):
        img = Image.new("RGB", size, "white")
        ImageDraw.Draw(img).ellipse((4 + i, 6, size[0] - 8, size[1] - 5 - i), fill=colour)
        out.append(img)
    return out


def oracle_pipeline(components, variant):
    """The variant's pipeline built here from diffusers and transformers classes alone (transformers' default
    Qwen2-VL image processor), with the tiny tokenizer's template prefix length."""
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class ImageOnly(Qwen2VLProcessor):  # no video processor: it needs torchvision
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    pipe = getattr(diffusers, variant.pipeline)(
        scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config), vae=components.vae,
        text_encoder=components.text_encoder, tokenizer=components.tokenizer,
        processor=ImageOnly(image_processor=Qwen2VLImageProcessorPil(), tokenizer=components.tokenizer),
        transformer=components.transformer)
    pipe.prompt_template_encode_start_idx = template_prefix_length(components.tokenizer, pipe.prompt_template_encode)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline_transformer_inputs(pipe, images, prompt, size=(64, 64)) -> dict:
    """What the pipeline passes the transformer at its first step."""
    seen = {}

    def hook(_module, _args, kwargs):
        seen.setdefault("kwargs", kwargs)

    handle = pipe.transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        pipe(image=images, prompt=prompt, true_cfg_scale=1.0, width=size[0], height=size[1], num_inference_steps=2,
             generator=torch.Generator().manual_seed(0), output_type="latent")
    finally:
        handle.remove()
    return seen["kwargs"]


@pytest.mark.parametrize("variant_name, count", [("edit", 1), ("edit-2509", 3), ("edit-2511", 2)])
def test_prompt_embeddings_control_latents_and_img_shapes_equal_the_pipelines(small_pipeline_sizes, variant_name, count):
    variant = get_variant(variant_name)
    components = build_tiny_edit_components(variant_name)
    images = control_images()[:count]
    prompt = "make the circle a square"
    oracle = oracle_pipeline(components, variant)
    seen = pipeline_transformer_inputs(oracle, images if variant.multi_image else images[0], prompt)

    ours = edit_pipeline(variant, components)
    prepared = [prepare_control(variant, ours, img) for img in images]
    embedding = encode_edit_prompt(variant, ours, prompt, [p.condition for p in prepared], components.device)
    controls = [encode_control_latents(ours, p.pixels, components.compute_dtype) for p in prepared]
    target = torch.zeros(1, (64 // 8) ** 2, 4 * 4)  # a 64 px target, tiny VAE: 8 px per token side -> (1, 64, 4C)
    hidden, img_shapes = append_controls(target, (64 // 8, 64 // 8), [controls])

    assert torch.equal(embedding, seen["encoder_hidden_states"][0])
    assert seen["encoder_hidden_states_mask"] is None or bool(seen["encoder_hidden_states_mask"].all())
    n = target.shape[1]
    assert torch.equal(hidden[:, n:], seen["hidden_states"][:, n:])
    assert img_shapes == seen["img_shapes"]
    assert len(img_shapes[0]) == 1 + count
    # Each control was sized by the rule at the (shrunken) area, keeping its own aspect ratio.
    assert [p.size.vae for p in prepared] == [(img_shapes[0][i + 1][2] * 8, img_shapes[0][i + 1][1] * 8)
                                             for i in range(count)]
    assert all(pack_latents(c.unsqueeze(0)).shape[-1] == 16 for c in controls)


def test_template_prefix_length_is_the_pipelines_own_with_the_real_tokenizer():
    """The pipelines drop 64 template tokens, counted for the real tokenizer; we count them with ours (ComfyUI
    ships the real Qwen2.5 tokenizer's vocab.json and merges.txt)."""
    import os
    from pathlib import Path

    from transformers import Qwen2Tokenizer

    folder = Path(os.environ.get("COMFYUI_PATH", "/nonexistent")) / "comfy" / "text_encoders" / "qwen25_tokenizer"
    if not folder.is_dir():
        pytest.skip("COMFYUI_PATH is not set: the real Qwen2.5 tokenizer comes from a ComfyUI checkout")
    tokenizer = Qwen2Tokenizer.from_pretrained(str(folder))
    components = build_tiny_edit_components("edit")
    for name in ("edit", "edit-2509"):
        pipe = edit_pipeline(get_variant(name), components, encoder=False)
        assert template_prefix_length(tokenizer, pipe.prompt_template_encode) == pipe.prompt_template_encode_start_idx == 64


@pytest.mark.parametrize("variant_name, count", [("edit", 1), ("edit-2511", 2)])
def test_preview_of_canvas_controls_equals_the_variants_own_pipeline_sampling(small_pipeline_sizes, tmp_path,
                                                                              variant_name, count):
    """The shared sampler with the Edit family's hooks (controls encoded now, the text-to-image pipeline around a
    transformer that appends them) gives the image the variant's own diffusers pipeline samples from the same
    control images, prompt, noise and settings."""
    from trainer_core.data.cache import CachedDataset
    from trainer_core.families.sampling import sample_image

    components = build_tiny_edit_components(variant_name)
    variant = get_variant(variant_name)
    images = control_images()[:count]
    prompt, negative = "paint it red", "blurry"
    pipe = oracle_pipeline(components, variant)
    expected = pipe(image=images if variant.multi_image else images[0], prompt=prompt, negative_prompt=negative,
                    true_cfg_scale=4.0, width=64, height=64, num_inference_steps=3,
                    generator=torch.Generator("cpu").manual_seed(5), output_type="pil").images[0]
    nothing_cached = CachedDataset(cache_dir=tmp_path, samples=[], prompt_keys={}, vae_fingerprint="",
                                   text_fingerprint="", family=variant_name)
    ours = sample_image(components, nothing_cached, prompt, negative, width=64, height=64, steps=3, cfg_scale=4.0,
                        seed=5, condition_images=images)
    assert ours.tobytes() == expected.tobytes()
    flipped = [img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) for img in images]  # the controls matter
    assert sample_image(components, nothing_cached, prompt, negative, width=64, height=64, steps=3, cfg_scale=4.0,
                        seed=5, condition_images=flipped).tobytes() != expected.tobytes()
