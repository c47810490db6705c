"""Model parts: diffusers folders, prompt embeddings and latent packing match the pinned diffusers pipeline."""

import torch

from trainer_core.families.qwen_image import build_tiny_components, load_diffusers_dir
from trainer_core.models import save_diffusers_dir
from trainer_core.models.float8 import FLOAT8, frozen_block_linears
from trainer_core.models.latents import decode_latents, encode_images, pack_latents, unpack_latents
from trainer_core.models.text import encode_prompts, pad_prompt_batch, pipeline_prompt_constants, template_prefix_length


def test_diffusers_folder_round_trip(tmp_path):
    original = build_tiny_components(storage="float32")
    save_diffusers_dir(original, tmp_path / "tiny")
    loaded = load_diffusers_dir(tmp_path / "tiny", storage="float32", compute_dtype=torch.float32)
    for part in ("transformer", "vae", "text_encoder"):
        a, b = getattr(original, part).state_dict(), getattr(loaded, part).state_dict()
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), part
    assert loaded.tokenizer.get_vocab() == original.tokenizer.get_vocab()
    assert loaded.scheduler_config["max_shift"] == 0.9


def test_diffusers_folder_loads_float8_block_linears(tmp_path):
    original = build_tiny_components(storage="float32")
    save_diffusers_dir(original, tmp_path / "tiny")
    loaded = load_diffusers_dir(tmp_path / "tiny", storage="float8", compute_dtype=torch.float32)
    pairs = zip(frozen_block_linears(original.transformer), frozen_block_linears(loaded.transformer))
    for (name, a), (_, b) in pairs:
        assert b.weight.dtype == FLOAT8
        assert torch.equal(b.weight, a.weight.clamp(-448, 448).to(FLOAT8)), name
    assert loaded.transformer.img_in.weight.dtype == torch.float32


def test_prompt_embeddings_equal_the_pipelines():
    from diffusers import QwenImagePipeline

    c = build_tiny_components()
    prompts = ["a red circle", "a green square on a white stripe pattern, quantity text"]
    pipe = QwenImagePipeline(scheduler=None, vae=None, text_encoder=c.text_encoder, tokenizer=c.tokenizer,
                             transformer=None)
    drop = template_prefix_length(c.tokenizer)
    pipe.prompt_template_encode_start_idx = drop  # the pipeline hard-codes the real tokenizer's 34
    expected, expected_mask = pipe.encode_prompt(prompts, device=torch.device("cpu"))
    ours, mask = pad_prompt_batch(encode_prompts(c.text_encoder, c.tokenizer, prompts))
    assert torch.equal(ours, expected)
    assert torch.equal(mask, expected_mask)
    template, max_tokens = pipeline_prompt_constants()
    assert template.count("{}") == 1 and max_tokens == 1024
    assert drop != 34  # derived from the tokenizer in use, not copied from the real one


def test_latent_packing_matches_the_pipeline():
    from diffusers import QwenImagePipeline

    latents = torch.randn(2, 4, 6, 8)  # (B, C, h, w)
    packed = pack_latents(latents)
    assert packed.shape == (2, 12, 16)
    assert torch.equal(packed, QwenImagePipeline._pack_latents(latents.unsqueeze(2), 2, 4, 6, 8))
    assert torch.equal(unpack_latents(packed, 6, 8), latents)


def test_vae_encode_decode_shapes_and_normalisation():
    c = build_tiny_components()
    images = torch.rand(2, 3, 32, 64) * 2 - 1
    latents = encode_images(c.vae, images)
    assert latents.shape == (2, 4, 8, 16)  # scale factor 2 ** len(temperal_downsample) = 4 for the tiny VAE
    assert decode_latents(c.vae, latents).shape == (2, 3, 32, 64)


def test_whole_diffusers_pipeline_runs_on_tiny_parts():
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    c = build_tiny_components(storage="float8")
    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_config(c.scheduler_config), vae=c.vae,
                             text_encoder=c.text_encoder, tokenizer=c.tokenizer, transformer=c.transformer)
    pipe.set_progress_bar_config(disable=True)
    image = pipe("a red circle", negative_prompt=" ", height=32, width=32, num_inference_steps=2,
                 output_type="pt").images
    assert image.shape == (1, 3, 32, 32) and torch.isfinite(image).all()


def test_fingerprint_follows_the_weights():
    a = build_tiny_components(seed=0)
    assert a.fingerprint("transformer") != build_tiny_components(seed=1).fingerprint("transformer")
    assert a.fingerprint("vae") == build_tiny_components(seed=0).fingerprint("vae")
