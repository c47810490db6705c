"""Previews that fit: a preview samples through the same block streaming as training (the trainer's ring), so a
streamed preview is the resident one, bit for bit on the CPU; and where the whole image's VAE decode would not fit,
it decodes in diffusers' tiles, which the memory plan counts (`inference.vae_tiled_decode_bytes`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from conftest import cached_demo


def test_a_streamed_preview_equals_a_resident_one_bit_for_bit(tiny_cache, demo_folder):
    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.families.qwen_image import build_tiny_components
    from trainer_core.training import Trainer

    images = []
    for swapped in (0, 1):
        components = build_tiny_components(storage="float8")
        cached = cached_demo(components, demo_folder, tiny_cache, preview_prompts=["a red star"])
        trainer = Trainer(components, cached, LoraConfig(rank=4), OptimizerConfig(learning_rate=1e-3),
                          TrainConfig(run_name=f"streamed_preview_{swapped}", blocks_to_swap=swapped,
                                      checkpoint_every=0))
        try:
            trainer.train(2)
            assert (trainer.built.runner.swapper is not None) == bool(swapped)
            image = trainer.sample_preview("a red star", cached.negative_prompt, 64, 64, 3, 4.0, 5)
            images.append(np.asarray(image))
            if swapped:
                assert trainer.built.runner.swapper.bytes_copied > 0  # the preview's forwards streamed the blocks
        finally:
            trainer.close()
    assert np.array_equal(images[0], images[1])


def test_the_tiled_decode_term_is_at_or_just_above_the_measured_peak():
    """diffusers' tiled decode of the Qwen-Image VAE's structure (base width 24: the per-pixel constant scales with
    it), 128 px in 64 px tiles every 48 px, against `LiveBytes`: the plan's term is never under the peak and at most
    10% over (measured while writing this: 7.5% over at 128 px, 5% at 96 px; 1.4% at the real width 96)."""
    from diffusers import AutoencoderKLQwenImage

    from trainer_core.devtools.memprobe import LiveBytes
    from trainer_core.planner.inference import real_parts, vae_decode_bytes, vae_tiled_decode_bytes

    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage(base_dim=24).float().eval()
    parts = dataclasses.replace(real_parts(), vae_base_dim=24)
    side, tile, stride = 128, 64, 48
    vae.enable_tiling(tile_sample_min_height=tile, tile_sample_min_width=tile, tile_sample_stride_height=stride,
                      tile_sample_stride_width=stride)
    latents = torch.randn(1, 16, 1, side // 8, side // 8)  # (B, C, frames, h, w)
    with torch.no_grad(), LiveBytes() as tiled:
        vae.decode(latents)
    planned = vae_tiled_decode_bytes(parts, side, side, 4, tile=tile, stride=stride)
    assert tiled.peak <= planned <= 1.1 * tiled.peak, (planned, tiled.peak)
    assert planned < vae_decode_bytes(parts, side, side, 4) / 2  # what tiling is for


def test_a_preview_that_does_not_fit_whole_is_planned_in_tiles_and_the_swap_search_uses_it():
    """At 16 GiB the Qwen-Image preview's whole 1024 x 1024 decode (3.4 GiB) would decide the swap count; decoded in
    tiles it no longer does, so fewer blocks stream (faster steps); with room to spare the decode stays whole."""
    from trainer_core.planner import GIB, PlanInputs, auto_blocks_to_swap, plan_memory
    from trainer_core.planner.arch import real_arch
    from trainer_core.planner.inference import real_parts
    from trainer_core.planner.phases import training_phases

    inputs = PlanInputs(width=1024, height=1024, rank=32)
    choice = auto_blocks_to_swap(inputs, 16 * GIB)
    plan = plan_memory(dataclasses.replace(inputs, blocks_to_swap=choice.blocks_to_swap))
    tight = training_phases(plan, real_arch(), real_parts(), 16 * GIB)["preview"]
    assert "the VAE decodes in tiles" in tight.note and tight.gpu_bytes <= 16 * GIB
    whole = training_phases(plan, real_arch(), real_parts())["preview"]
    assert whole.gpu_bytes > 16 * GIB > tight.gpu_bytes  # the whole decode would not have fitted at this count
    roomy = training_phases(plan, real_arch(), real_parts(), 80 * GIB)["preview"]
    assert "tiles" not in roomy.note and roomy.gpu_bytes == whole.gpu_bytes


@pytest.mark.parametrize("free_gib, tiles", [(0.1, True), (64.0, False)])
def test_the_sampler_decodes_in_tiles_only_when_the_whole_decode_does_not_fit(free_gib, tiles):
    """`planner.device.preview_decode_in_tiles` compares the whole decode (and the VAE) with the room the GPU has now
    (`device.room_now`; the sampler reads it, given here); on the CPU it never tiles."""
    from trainer_core.planner.device import DeviceMemory

    from trainer_core.families.qwen_image import build_tiny_components
    from trainer_core.planner.device import preview_decode_in_tiles

    components = build_tiny_components(storage="float32")
    def memory(free: float) -> DeviceMemory:
        return DeviceMemory(free=int(free * (1 << 30)), total=80 << 30, reserved=0, allocated=0)

    assert not preview_decode_in_tiles(components, 1024, 1024, memory(0))  # the CPU: host RAM, planned whole
    components.device = torch.device("cuda")  # the decision alone: nothing is placed there
    assert preview_decode_in_tiles(components, 1024, 1024, memory(free_gib)) == tiles
