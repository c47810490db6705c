"""The memory plan of Qwen-Image 2.1 editing (planner/references.py, planner/caching.py): what a reference image adds
to caching (its vision tokens in the prompt, the vision tower's forward, its encode) and to previews, checked against
the pinned pipeline's own prompt encoding with a reference, measured by `LiveBytes` on real-width vision blocks.
"""

import dataclasses

import pytest
import torch

from trainer_core.planner import GIB, PlanInputs
from trainer_core.families.qwen_image21.plan import real_arch21
from trainer_core.families.qwen_image21.plan import real_parts21
from trainer_core.planner.phases import plan_phases
from trainer_core.planner.references import patches, slots, vision_bytes, with_references


def test_the_parts_know_qwen3_vl_8b_vision_tower():
    from trainer_core.families.qwen_image21.arch import QWEN3_VL_8B_CONFIG

    vision, parts = QWEN3_VL_8B_CONFIG["vision_config"], real_parts21()
    assert (parts.vision_layers, parts.vision_hidden, parts.vision_out) == (27, 1152, 4096)
    assert (parts.vision_patch, parts.vision_merge, parts.vision_deepstack) == (16, 2, (8, 16, 24)) == (
        vision["patch_size"], vision["spatial_merge_size"], tuple(vision["deepstack_visual_indexes"]))
    assert 0.5e9 < parts.vision_params < 0.7e9  # inside the 8.77B the weights term counts (loaded whole)
    assert patches(parts, (1024, 1024)) == 4096 and slots(parts, (1024, 1024)) == 1024  # one slot per 32 x 32 px


def _encoder(depth: int, deepstack: list[int], text_hidden: int = 256):
    """A Qwen3-VL of the real vision width (1152, 16 heads, patch 16, merge 2) with `depth` blocks, and a one-layer
    language model of width `text_hidden` (the tower's merged width follows it), the tiny tokenizer; bf16."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from trainer_core.families.qwen_image21.processor import build_processor
    from trainer_core.families.qwen_image21.tiny import tiny_text_config
    from trainer_core.families.qwen_image21.arch import QWEN3_VL_8B_CONFIG
    from trainer_core.models.tiny import SPECIAL_TOKENS, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    cfg = tiny_text_config(len(tokenizer), {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS})
    cfg["text_config"].update(hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=text_hidden // 2)
    cfg["text_config"]["rope_parameters"]["mrope_section"] = [text_hidden // 8 - 2 * (text_hidden // 24),
                                                              text_hidden // 24, text_hidden // 24]
    cfg["vision_config"] = dict(QWEN3_VL_8B_CONFIG["vision_config"], depth=depth, deepstack_visual_indexes=deepstack,
                                out_hidden_size=text_hidden)
    config = Qwen3VLConfig(**cfg)
    torch.manual_seed(0)
    encoder = Qwen3VLForConditionalGeneration(config).to(torch.bfloat16).requires_grad_(False).eval()
    return encoder, build_processor(tokenizer, config.vision_config)


@pytest.mark.parametrize("depth,deepstack,side", [(2, [0], 256), (1, [], 320)])
def test_the_vision_tower_in_the_pipelines_prompt_encoding_holds_what_the_plan_says(depth, deepstack, side):
    """The pipeline's `encode_prompt` with one reference, measured by `LiveBytes`: (1) the peak while the vision tower
    runs and (2) what is alive when the language model starts equal the plan's tower peak and kept bytes, plus the
    prompt's embeddings (made before the tower runs), less the processor's float32 pixels (made from numpy, which
    `LiveBytes` does not see; on a GPU their copy is a tensor op), give or take the small index tensors (position
    ids, masks: under 64 B per token)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline
    from PIL import Image

    from trainer_core.devtools.memprobe import LiveBytes
    from trainer_core.families.qwen_image21.tiny import QWEN_IMAGE21_SCHEDULER_CONFIG
    from trainer_core.planner.inference import vision_fields

    encoder, processor = _encoder(depth, deepstack)
    parts = dataclasses.replace(real_parts21(), **vision_fields(encoder))
    pipe = QwenImage21Pipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_config(QWEN_IMAGE21_SCHEDULER_CONFIG),
                               vae=None, text_encoder=encoder, processor=processor, transformer=None)
    image = Image.new("RGBA", (side, side), (10, 200, 30, 255))
    seen = {}
    with torch.no_grad(), LiveBytes() as live:
        def at_language_model(_module, args, kwargs):
            seen.update(tokens=kwargs["inputs_embeds"].shape[1], alive=live.current, tower_peak=live.peak)

        hook = encoder.model.language_model.register_forward_pre_hook(at_language_model, with_kwargs=True)
        _embeds, _mask, image_slots = pipe.encode_prompt("a red cup", image=[image], device="cpu")
        hook.remove()
    assert int(image_slots.sum()) == slots(parts, (side, side))
    peak, kept = vision_bytes(parts, [(side, side)], 2)
    pixels = patches(parts, (side, side)) * 3 * 2 * 16 * 16 * 4
    embeddings = seen["tokens"] * encoder.config.text_config.hidden_size * 2
    for measured, planned in ((seen["tower_peak"], peak), (seen["alive"], kept)):
        assert 0 <= measured - (planned - pixels + embeddings) <= 64 * seen["tokens"]


def test_with_references_adds_their_rows_as_the_edit_datasets_plan_does():
    p = with_references(PlanInputs(width=1024, height=768), 2, 512)
    assert p.reference_sizes == ((512, 512), (512, 512)) and p.width == 1024
    assert p.height == 768 + 512  # 2 x 512² px of rows, 1024 wide
    assert with_references(PlanInputs(), 0, 512) == PlanInputs()


def test_references_raise_caching_and_previews_by_their_terms():
    arch, parts = real_arch21(), real_parts21()
    plain = plan_phases(PlanInputs(rank=32), arch, parts=parts)
    edit = plan_phases(with_references(PlanInputs(rank=32), 1, 1024), arch, parts=parts)
    te = {t.name: t for t in edit.phases["cache"].gpu}
    peak, kept = vision_bytes(parts, [(1024, 1024)], 2)
    assert te["text encoder weights"].bytes == parts.text_encoder_params * 2  # the tower was in them already
    from trainer_core.planner.inference import text_encoder_working_bytes

    tokens = 256 + 1024 + 8  # the prompt, its reference's vision tokens and their template
    embeddings = (tokens + 40) * 4096 * 2  # the prompt's embeddings, chat template included, made before the tower
    assert te["text encoder forward"].bytes == max(text_encoder_working_bytes(parts, tokens) + kept, peak + embeddings)
    assert edit.phases["cache"].gpu_bytes > plain.phases["cache"].gpu_bytes
    assert edit.phases["preview"].gpu_bytes - plain.phases["preview"].gpu_bytes > 4 * GIB  # KV cache + reference rows
    assert edit.phases["train"].gpu_bytes > plain.phases["train"].gpu_bytes  # 4096 more image rows


def test_plan_command_with_references(capsys):
    from trainer_core.runs.cli import main

    assert main(["plan", "--model", "qwen-image-2.1", "--references", "1", "--control-resolution", "512",
                 "--budget-gb", "24"]) == 0
    assert "Memory plan: 1024x1280" in capsys.readouterr().out  # 512² px of reference rows
    assert main(["plan", "--model", "qwen-image-2.1", "--references", "10", "--control-resolution", "512",
                 "--budget-gb", "24"]) == 0  # 2.1 edits with up to ten
    assert "Memory plan: 1024x3584 (the target and 10 reference image(s)" in capsys.readouterr().out  # 10 x 512² px
    assert main(["plan", "--model", "qwen-image-2.1", "--references", "11"]) == 2
    assert "--references: 11 must be from 0 to 10" in capsys.readouterr().err
    assert main(["plan", "--references", "1"]) == 2
    assert "qwen-image-2.1 only" in capsys.readouterr().err
    assert main(["plan", "--model", "qwen-image-2.1", "--references", "1", "--control-resolution", "128"]) == 2
    assert "256x256" in capsys.readouterr().err
