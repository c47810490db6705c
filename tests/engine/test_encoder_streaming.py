"""Caching with the text encoder streamed (streaming/encoder.py): its decoder layers, and its vision tower's blocks,
read into host memory and copied through a ring of slots before each runs, as the transformer's streamed blocks are.
On the CPU the copies are plain copies, so the cache a streamed encoder writes must equal, bit for bit, the one the
resident encoder writes: prompts (Qwen-Image), prompts with control images (Edit-2511) and with reference images
(Qwen-Image 2.1 editing), from ComfyUI's files (2.1's text encoder in int8 ConvRot, kept)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw
from safetensors.torch import load_file

from conftest import REPO
from trainer_core.core.config import DatasetConfig
from trainer_core.data.cache import build_cache
from trainer_core.planner.device import CachingPlacement
from trainer_core.streaming.encoder import StreamedLayers

CPU = torch.device("cpu")


def cache_text(components, samples, folder: Path, streamed: StreamedLayers, settings=None, prompts=()) -> dict:
    """Build the cache with the encoder placed as `streamed` says; every text entry's tensors, by file name."""
    placement = CachingPlacement(components, streamed=streamed)
    components.text_encoder_placement = placement
    build_cache(components, samples, folder, preview_prompts=list(prompts), settings=settings)
    assert placement.decided == streamed
    if streamed.any:  # the layers did stream: bytes moved through the ring
        assert placement.bytes_streamed > 0
    assert placement.streams is None  # taken down with the encoder: nothing holds its layers through training
    entries = {p.name: load_file(str(p)) for p in sorted((folder / "text").glob("*.safetensors"))}
    assert entries
    return entries


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].keys() == b[name].keys()
        for key in a[name]:
            assert torch.equal(a[name][key], b[name][key]), (name, key)


def test_streamed_qwen_image_prompts_equal_resident_ones_bit_for_bit(tiny_files, demo_folder, tmp_path):
    from trainer_core.data.images import load_dataset
    from trainer_core.families.qwen_image import load_single_files

    samples = list(load_dataset(DatasetConfig(folder=str(demo_folder), resolution=64, min_bucket_side=32,
                                              max_bucket_side=128)).samples)[:3]

    def run(streamed, name):
        components = load_single_files(tiny_files["transformer_bf16"], tiny_files["text_encoder_fp8_scaled"],
                                       tiny_files["vae"], tiny_files["tokenizer"], storage="float32",
                                       compute_dtype=torch.float32, text_encoder_fp8="keep")
        return cache_text(components, samples, tmp_path / name, streamed, prompts=["a red star"])

    assert_same(run(StreamedLayers(), "resident"), run(StreamedLayers(decoder=2), "streamed"))


def test_streamed_edit_prompts_with_their_controls_equal_resident_ones_bit_for_bit(tmp_path):
    """Edit-2511: the decoder and the vision tower (which sees the controls) both stream."""
    from trainer_core.families import get_family
    from trainer_core.data.edit_dataset import load_edit_dataset
    from trainer_core.families.qwen_image_edit.files import load_edit_single_files

    files = get_family("edit-2511").export_tiny(tmp_path / "tiny")
    folder = tmp_path / "edits"
    folder.mkdir()
    for path in (REPO / "example_dataset" / "edit_shapes").glob("0[01]_*"):
        shutil.copy(path, folder / path.name)

    def run(streamed, name):
        from trainer_core.core.config import EditDataConfig

        components = load_edit_single_files(files["transformer_bf16"], files["text_encoder_bf16"], files["vae"],
                                            files["tokenizer"], storage="float32", compute_dtype=torch.float32)
        dataset = load_edit_dataset(DatasetConfig(folder=str(folder), resolution=64, min_bucket_side=32,
                                                  max_bucket_side=128), EditDataConfig(control_resolution=96))
        return cache_text(components, list(dataset.samples), tmp_path / name, streamed,
                          settings=components.family.data_settings(dataset))

    assert_same(run(StreamedLayers(), "resident"), run(StreamedLayers(decoder=2, vision=1), "streamed"))


def test_streamed_21_prompts_with_their_references_equal_resident_ones_bit_for_bit(tmp_path):
    """Qwen-Image 2.1 editing from ComfyUI's int8 ConvRot text encoder, kept in int8: decoder and vision streamed."""
    from int8_files import int8_copy

    from trainer_core.families import get_family
    from trainer_core.data.edit_dataset import load_edit_dataset
    from trainer_core.families.loading import LoadRequest, load_model_set
    from trainer_core.models.source import FILES

    pytest.importorskip("comfy_kitchen")
    files21 = get_family("qwen-image-2.1").export_tiny(tmp_path / "tiny21", layout="comfyui")
    encoder = int8_copy(files21["text_encoder"], tmp_path / "qwen3vl_8b_int8_convrot.safetensors", lambda k: True)
    folder = tmp_path / "edits"
    folder.mkdir()
    Image.new("RGB", (128, 64), (200, 60, 40)).save(folder / "a.png")
    (folder / "a.txt").write_text("paint the circle red")
    reference = Image.new("RGB", (288, 288), "white")
    ImageDraw.Draw(reference).ellipse((60, 60, 220, 220), fill=(40, 70, 220))
    reference.save(folder / "a_control.png")

    def run(streamed, name):
        from trainer_core.core.config import EditDataConfig

        components = load_model_set(LoadRequest(FILES, CPU, storage="float32", compute_dtype="float32",
                                     transformer=files21["transformer_bf16"], text_encoder=encoder,
                                     diffusers_folder=files21["diffusers_folder"], text_encoder_fp8="keep"))
        dataset = load_edit_dataset(DatasetConfig(folder=str(folder), resolution=64, min_bucket_side=32,
                                                  max_bucket_side=128), EditDataConfig(control_resolution=288))
        return cache_text(components, list(dataset.samples), tmp_path / name, streamed,
                          settings=components.family.data_settings(dataset))

    assert_same(run(StreamedLayers(), "resident"), run(StreamedLayers(decoder=2, vision=1), "streamed"))


def test_a_released_streamed_encoder_leaves_host_memory(tiny_files):
    """Dropping the text encoder after caching frees it when its layers were streamed, as when they were not: the
    placement's streams (their wrapped forwards, their swappers' masters) must not keep its layers alive through
    training. The real-size 2.1 rehearsal caught 8 GiB of encoder held so."""
    import weakref

    from trainer_core.families.qwen_image import load_single_files
    from trainer_core.models.components import CachingWork

    components = load_single_files(tiny_files["transformer_bf16"], tiny_files["text_encoder_fp8_scaled"],
                                   tiny_files["vae"], tiny_files["tokenizer"], storage="float32",
                                   compute_dtype=torch.float32, text_encoder_fp8="keep")
    placement = CachingPlacement(components, streamed=StreamedLayers(decoder=2))
    components.text_encoder_placement = placement
    components.ensure_text_encoder(CachingWork())
    encoder = weakref.ref(components.text_encoder)
    assert placement.streams is not None
    components.release_text_encoder()
    assert placement.streams is None
    assert encoder() is None


@pytest.mark.parametrize("one_byte", [False, True])
def test_the_plan_counts_a_streamed_encoders_device_and_host_bytes(one_byte):
    """The caching plan's weights and ring-slot terms with k decoder layers and a vision block streamed equal the
    bytes a streamed Qwen3-VL holds outside its streamed layers' masters (parameters and buffers where they are, the
    ring's slot buffers), and its host term the masters' bytes: exact, as the planner's weight terms are. The rest of
    the prompts step (the forward's working bytes, calibrated at the real width by tools/calibrate_qwen21.py) is the
    resident encoder's, measured equal here; the real-size rehearsal checks the whole caching peak against the plan."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from trainer_core.families.qwen_image21.tiny import tiny_text_config
    from trainer_core.models.float8 import frozen_linears, quantize_weight
    from trainer_core.models.streaming import assign_frozen_linear_weight
    from trainer_core.planner import PlanInputs
    from trainer_core.planner.caching import cache_host_terms, cache_steps
    from trainer_core.families.qwen_image21.plan import real_parts21
    from trainer_core.planner.inference import parts_for_encoder
    from trainer_core.streaming.encoder import EncoderStreams, encoder_stacks
    from trainer_core.streaming.placement import default_placement

    config = tiny_text_config(64, {t: i for i, t in enumerate(("<|im_end|>", "<|endoftext|>", "<|image_pad|>",
                                                               "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"))})
    config["text_config"].update(hidden_size=64, intermediate_size=128, num_hidden_layers=6, head_dim=16,
                                 num_attention_heads=4, num_key_value_heads=2)
    config["vision_config"].update(depth=3, hidden_size=32, intermediate_size=64, out_hidden_size=64)
    torch.manual_seed(0)
    encoder = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**config)).to(torch.bfloat16).eval()
    encoder.lm_head = torch.nn.Identity()  # as the file loaders build it
    parts = parts_for_encoder(encoder, real_parts21(lm_head=False))
    if one_byte:  # the decoder's Linears kept in one byte (the plan counts the tower's in bf16 either way)
        for _, linear in frozen_linears(encoder.model.language_model.layers):
            stored, _ = quantize_weight(linear.weight.data.float(), "float8")
            assign_frozen_linear_weight(linear, stored, None)
    streamed = StreamedLayers(decoder=3, vision=0)
    inputs = PlanInputs(device="cuda", text_encoder_storage="float8" if one_byte else "bfloat16",
                        text_encoder_streamed=streamed.decoder, vision_streamed=streamed.vision)
    prompts, _ = cache_steps(inputs, parts)
    planned = {t.name: t.bytes for t in prompts}
    streams = EncoderStreams.install(encoder, CPU, streamed)
    held = sum(t.numel() * t.element_size() for t in [*encoder.parameters(), *encoder.buffers()]
               if t.numel()) + sum(s.swapper.slot_bytes for s in streams.streams)
    rotary = sum(b.numel() * b.element_size() for b in encoder.buffers())  # RoPE tables: not planned (KBs)
    assert planned["text encoder weights"] + planned["text encoder ring slots"] == held - rotary
    layers = encoder_stacks(encoder)["decoder"]
    masters = sum(master.numel() * master.element_size() for stream in streams.streams
                  for weights in stream.swapper.master.values() for master in weights)
    assert sorted(streams.streams[0].swapper.master) == list(default_placement(len(layers), 3).streamed) == [1, 3, 5]
    # On CUDA the masters sit in the swapper's pinned arena: its chunks' unused room, and the largest chunk, page-locked
    # whole while the weights it receives are still in ordinary memory (streaming.arena), as the plan counts them.
    caps = [cap for stream in streams.streams for cap in stream.swapper.arena.caps]
    assert {t.name: t.bytes for t in cache_host_terms(inputs, parts)} == {
        "text encoder: streamed layers' masters": masters, "text encoder: pinned arena slack": sum(caps) - masters,
        "text encoder: pinned chunk being filled": max(caps)}
    # The forward's own bytes (the plan's "text encoder forward" and upcast terms) do not change with streaming: the
    # copies go into the ring's slots, allocated at install, so a prompt's live-bytes peak is the resident one's.
    streamed_peak = prompt_forward_peak(encoder)
    streams.uninstall()
    assert streamed_peak == prompt_forward_peak(encoder) > 0


def prompt_forward_peak(encoder) -> int:
    """The live bytes a prompt's forward allocates at its peak (every hidden state kept, as the 2.1 pipeline asks)."""
    from trainer_core.devtools.memprobe import LiveBytes

    ids = torch.arange(3, 43).unsqueeze(0) % encoder.config.text_config.vocab_size  # (1, 40)
    with torch.no_grad(), LiveBytes() as live:
        out = encoder(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
        del out
    return live.peak


def test_the_caching_timeline_copies_each_streamed_layer_once_per_prompt():
    """planner/caching_time.py: with k decoder layers streamed every prompt's forward copies each of them once (the
    ring holds two: none stays from one prompt to the next), streaming never makes it faster, and with none
    streamed it is the resident time."""
    import dataclasses

    from trainer_core.planner import PlanInputs
    from trainer_core.planner.caching import streamed_layer_bytes
    from trainer_core.planner.caching_time import caching_time
    from trainer_core.planner.gpus import GPUS
    from trainer_core.families.qwen_image21.plan import real_parts21

    parts, gpu = real_parts21(lm_head=False), GPUS["rtx4060ti-16gb"]
    inputs = PlanInputs(text_encoder_storage="float8", text_encoder_streamed=0)
    resident = caching_time(inputs, parts, gpu, captions=10)
    assert resident.seconds == resident.resident_seconds and resident.copy_bytes == 0
    streamed = caching_time(dataclasses.replace(inputs, text_encoder_streamed=13), parts, gpu, captions=10)
    layer, _ = streamed_layer_bytes(inputs, parts)
    assert streamed.copy_bytes == 10 * 13 * layer
    assert streamed.resident_seconds == resident.seconds <= streamed.seconds
