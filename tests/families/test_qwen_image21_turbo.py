"""Qwen-Image 2.1 Turbo (issue 41, item 2): its files load as 2.1's (the same architecture, text encoder and VAE), its
name tells it apart, and its previews sample as ComfyUI's Turbo template does: 8 fixed sigmas, CFG 1, whatever the
preview settings say; a LoRA trained on the base has every key of a Turbo model."""

from __future__ import annotations

import shutil

import numpy as np
import torch

from test_qwen_image21 import FAMILY, one_image, pipeline
from trainer_core.families import get_family
from trainer_core.families.qwen_image21.turbo import TURBO_SCHEDULER, TURBO_SIGMAS, is_turbo


def test_a_turbo_file_loads_as_21_and_says_how_it_previews(tmp_path):
    from trainer_core.families.loading import LoadRequest, load_model_set
    from trainer_core.models.source import FILES

    files = get_family(FAMILY).export_tiny(tmp_path / "tiny21", layout="comfyui")
    turbo = files["transformer_bf16"].with_name("qwen_image_2.1_turbo_tiny_bf16.safetensors")
    shutil.copyfile(files["transformer_bf16"], turbo)
    shutil.copyfile(files["transformer_bf16"].with_suffix(".json"), turbo.with_suffix(".json"))  # the tiny's config

    def load(transformer):
        return load_model_set(LoadRequest(FILES, "cpu", storage="bfloat16", transformer=transformer,
                                          text_encoder=files["text_encoder"], vae=files["vae"],
                                          diffusers_folder=files["diffusers_folder"]))

    base, fast = load(files["transformer_bf16"]), load(turbo)
    family = fast.family
    assert base.family is family and family.name == FAMILY
    assert not is_turbo(base) and is_turbo(fast)
    assert family.preview_schedule(base, 20, 4.0) == (20, 4.0, None)
    assert family.preview_schedule(fast, 20, 4.0) == (8, 1.0, TURBO_SIGMAS)
    assert family.describe(base) == "Qwen-Image 2.1"
    assert family.describe(fast).startswith("Qwen-Image 2.1 Turbo (previews sample on its 8 sigmas at CFG 1")


def test_a_turbo_preview_steps_through_the_templates_sigmas_as_the_pipeline_does(tmp_path):
    """Our preview of a Turbo model set, asked for 20 steps at CFG 4, equals `QwenImage21Pipeline` run from the prompt
    on Turbo's sigmas at CFG 1, whose scheduler stepped through exactly those sigmas (no size shift, no stretch)."""
    import dataclasses

    from trainer_core.data.cache import build_cache
    from trainer_core.families.sampling import sample_image

    tiny = get_family(FAMILY).tiny_components(storage="float32")
    turbo = dataclasses.replace(tiny, name="qwen_image_2.1_turbo_tiny")
    prompt = "a red circle on a white background"
    cached = build_cache(turbo, [one_image(tmp_path)], tmp_path / "cache", preview_prompts=[prompt, "blurry"])
    seen = []
    ours = sample_image(turbo, cached, prompt, "blurry", width=64, height=96, steps=20, cfg_scale=4.0, seed=3,
                        progress=lambda i, n: seen.append((i, n)))
    assert seen == [(i, 8) for i in range(1, 9)]
    turbo.ensure_text_encoder()
    pipe = pipeline(turbo, dict(turbo.scheduler_config, **TURBO_SCHEDULER))
    theirs = pipe(prompt=prompt, width=64, height=96, sigmas=list(TURBO_SIGMAS),
                  generator=torch.Generator("cpu").manual_seed(3)).images[0]
    assert pipe.scheduler.sigmas.tolist() == list(torch.tensor([*TURBO_SIGMAS, 0.0]).tolist())
    assert np.array_equal(np.asarray(ours), np.asarray(theirs))


def test_a_lora_trained_on_the_base_has_every_key_of_a_turbo_model(tmp_path):
    """The same architecture: a LoRA file from a 2.1 run loads into a Turbo model (here another seed's weights, as
    Turbo's are other weights) through diffusers' own loader with every key used, in both layouts Save writes."""
    from peft.tuners.lora import LoraLayer
    from safetensors.torch import save_file

    from trainer_core.adapters.lora import inject_lora
    from trainer_core.adapters.lora_files import lora_file_tensors
    from trainer_core.core.config import LoraConfig

    base = get_family(FAMILY).tiny_components(seed=0, storage="float32")
    inject_lora(base.transformer, LoraConfig(rank=2, alpha=2.0, targets="all"), seed=0)
    for layout in ("comfyui", "diffusers"):
        tensors = lora_file_tensors(base.transformer, rank=2, alpha=2.0, dtype=torch.float32, layout=layout)
        save_file(tensors, str(tmp_path / f"{layout}.safetensors"))
        turbo = get_family(FAMILY).tiny_components(seed=1, storage="float32")
        pipe = pipeline(turbo)
        pipe.load_lora_weights(str(tmp_path / f"{layout}.safetensors"))
        loaded = {n for n, m in turbo.transformer.named_modules() if isinstance(m, LoraLayer)}
        ours = {n for n, m in base.transformer.named_modules() if isinstance(m, LoraLayer)}
        assert loaded == ours, layout
