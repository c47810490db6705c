"""What Qwen-Image-Edit's control images add to its caching plan: the Qwen2.5-VL vision tower's forward on them
(planner/references.py with Edit's parts), measured by `LiveBytes` on real-width Qwen2.5-VL vision blocks in the
pinned Edit-Plus pipeline's own prompt encoding, and the sizes its processor hands the tower."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainer_core.models.qwen_arch import QWEN25_VL_7B_CONFIG
from trainer_core.planner.inference import real_parts, vision_fields
from trainer_core.planner.references import patches, slots, vision_bytes


def _encoder(depth: int, full: list[int], text_hidden: int = 256):
    """A Qwen2.5-VL of the real 7B's vision width (1280, 16 heads, MLP 3420, patch 14, merge 2, window 112) with
    `depth` blocks (`full`: those with full attention), a one-layer language model of width `text_hidden` (the
    merger's output follows it), the tiny tokenizer; bf16."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from trainer_core.families.qwen_image_edit.processor import build_processor
    from trainer_core.models.tiny import SPECIAL_TOKENS, build_tiny_tokenizer, tiny_text_config

    tokenizer = build_tiny_tokenizer()
    cfg = tiny_text_config(len(tokenizer), {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS})
    cfg["text_config"].update(hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1)
    cfg["text_config"]["rope_parameters"]["mrope_section"] = [16, 24, 24]
    vision = {k: v for k, v in QWEN25_VL_7B_CONFIG["vision_config"].items() if k != "model_type"}
    cfg["vision_config"] = dict(vision, depth=depth, fullatt_block_indexes=full, out_hidden_size=text_hidden)
    config = Qwen2_5_VLConfig(**cfg)
    torch.manual_seed(0)
    encoder = Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16).requires_grad_(False).eval()
    return encoder, tokenizer, build_processor(tokenizer, config.vision_config)


@pytest.mark.parametrize("depth,full,side", [(1, [0], 392), (2, [1], 336)])
def test_the_vision_tower_in_the_edit_pipelines_prompt_encoding_holds_what_the_plan_says(depth, full, side):
    """Edit-Plus's `encode_prompt` with one control image, measured by `LiveBytes`: the peak while the vision tower
    runs and what is alive when the language model starts equal the plan's tower peak and kept bytes, plus the
    prompt's embeddings, less the processor's float32 pixels (made from numpy, unseen by `LiveBytes`), give or take
    the small index tensors (under 64 B per token). A window block and a full-attention block alike."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImageEditPlusPipeline
    from PIL import Image

    from trainer_core.devtools.memprobe import LiveBytes
    from trainer_core.families.qwen_image_edit.pipelines import processor_view

    encoder, tokenizer, processor = _encoder(depth, full)
    parts = dataclasses.replace(real_parts(), **vision_fields(encoder))
    pipe = QwenImageEditPlusPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=None, text_encoder=encoder,
                                     tokenizer=tokenizer, processor=processor, transformer=None)
    seen = {}
    with torch.no_grad(), LiveBytes() as live:
        def at_language_model(_module, args, kwargs):
            seen.update(tokens=kwargs["inputs_embeds"].shape[1], alive=live.current, tower_peak=live.peak)

        hook = encoder.model.language_model.register_forward_pre_hook(at_language_model, with_kwargs=True)
        pipe.encode_prompt("a red cup", image=[Image.new("RGB", (side, side), (10, 200, 30))], device="cpu")
        hook.remove()
    size = processor_view((side, side))
    assert size == (side, side)  # already on the 28 px grid
    peak, kept = vision_bytes(parts, [size], 2)
    pixels = patches(parts, size) * 3 * 2 * 14 * 14 * 4
    embeddings = seen["tokens"] * encoder.config.text_config.hidden_size * 2
    assert seen["tokens"] > slots(parts, size)
    for measured, planned in ((seen["tower_peak"], peak), (seen["alive"], kept)):
        assert 0 <= measured - (planned - pixels + embeddings) <= 64 * seen["tokens"]


def test_the_real_qwen25_vl_tower_as_the_plan_counts_it():
    """The 7B's tower on the meta device: what a loaded Edit encoder adds to the text encoder's weights."""
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    config = Qwen2_5_VLConfig(**QWEN25_VL_7B_CONFIG).vision_config
    with torch.device("meta"):
        tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(config)
    fields = vision_fields(type("Encoder", (), {"model": type("M", (), {"visual": tower}),
                                                "config": type("C", (), {"vision_config": config})}))
    assert (fields["vision_layers"], fields["vision_hidden"], fields["vision_out"]) == (32, 1280, 3584)
    assert (fields["vision_patch"], fields["vision_merge"], fields["vision_deepstack"]) == (14, 2, ())
    assert 0.6e9 < fields["vision_params"] < 0.7e9
