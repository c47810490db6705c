"""The latent / prompt cache: content keys, zero encoder calls on a cached re-run, partial re-encoding."""

import shutil

import pytest
import torch
from PIL import Image

from conftest import cached_demo


class ForwardCounter:
    """Counts real forward calls of a module (a hook on the real module, not a stand-in)."""

    def __init__(self, module):
        self.calls = 0
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.calls += 1


def _count_encoder_calls(components):
    return ForwardCounter(components.vae.encoder), ForwardCounter(components.text_encoder)


def test_second_run_makes_zero_encoder_calls(tiny, demo_folder, tmp_path):
    vae_calls, text_calls = _count_encoder_calls(tiny)
    first = cached_demo(tiny, demo_folder, tmp_path, preview_prompts=["a red circle"], negative_prompt="blurry")
    assert vae_calls.calls > 0 and text_calls.calls > 0
    assert first.report.latents_encoded == 8 and first.report.prompts_encoded == 8 + 3

    # A fresh model set (same weights) over the same data: everything comes from disk.
    from trainer_core.families.qwen_image import build_tiny_components

    again = build_tiny_components(seed=0, storage="float32")
    vae_calls, text_calls = _count_encoder_calls(again)
    second = cached_demo(again, demo_folder, tmp_path, preview_prompts=["a red circle"], negative_prompt="blurry")
    assert (vae_calls.calls, text_calls.calls) == (0, 0)
    assert second.report.latents_reused == 8 and second.report.prompts_reused == 11
    for a, b in zip(first.samples, second.samples):
        assert torch.equal(first.latents(a.latent_key), second.latents(b.latent_key))


def test_changing_one_image_re_encodes_only_that_image(tiny, demo_folder, tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(demo_folder, folder)
    cached_demo(tiny, folder, tmp_path / "cache")
    Image.new("RGB", (64, 64), "black").save(folder / "03_green_square.png")
    counter = ForwardCounter(tiny.vae.encoder)
    report = cached_demo(tiny, folder, tmp_path / "cache").report
    assert (report.latents_encoded, report.latents_reused) == (1, 7)
    assert counter.calls == 1
    assert report.prompts_encoded == 0


def test_encoders_are_released_and_prompts_kept(tiny, demo_folder, tmp_path):
    cached = cached_demo(tiny, demo_folder, tmp_path, preview_prompts=["a red circle"])
    assert tiny.text_encoder is None and tiny.tokenizer is None
    assert next(tiny.vae.parameters()).device.type == "cpu"
    assert cached.prompt_embedding("a red circle").shape[1] == 16  # (tokens, text hidden size)
    assert cached.prompt_embedding("").shape[0] > 0
    # A later cache run that meets a new caption brings the text encoder back by itself.
    report = cached_demo(tiny, demo_folder, tmp_path, preview_prompts=["a new prompt"]).report
    assert report.prompts_encoded == 1


def test_cut_short_cache_entry_is_encoded_again(tiny, demo_folder, tmp_path):
    cached = cached_demo(tiny, demo_folder, tmp_path)
    entry = tmp_path / "latents" / f"{cached.samples[0].latent_key}.safetensors"
    entry.write_bytes(entry.read_bytes()[:-10])
    report = cached_demo(tiny, demo_folder, tmp_path).report
    assert report.latents_encoded == 1


@pytest.mark.parametrize("size", [1, 3])
def test_caching_batch_size_does_not_change_latents(tiny, demo_folder, tmp_path, size):
    ref = cached_demo(tiny, demo_folder, tmp_path / "ref", batch_size=8)
    other = cached_demo(tiny, demo_folder, tmp_path / f"b{size}", batch_size=size)
    for a, b in zip(ref.samples, other.samples):
        assert torch.allclose(ref.latents(a.latent_key), other.latents(b.latent_key), atol=1e-5)
