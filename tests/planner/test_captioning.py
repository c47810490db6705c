"""The captioning phase (`plan --caption`, planner/captioning.py): its weights are the whole vision-language model's
parameters (counted by transformers on the meta device, an oracle we did not write), its KV cache is the real
configs' layers x 2 x KV heads x head dim x tokens x 2 bytes, its image is sized as transformers' own processor sizes
it; it is planned only when asked and changes nothing else of a plan; the command prints it."""

import dataclasses

import numpy as np
import pytest
import torch
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from trainer_core.core.config import PlanConfig, field_default
from trainer_core.families import get_family
from trainer_core.families.qwen_image21.arch import QWEN3_VL_8B_CONFIG
from trainer_core.families.qwen_image_edit.processor import QWEN25_VL_MAX_PIXELS, QWEN25_VL_MIN_PIXELS
from trainer_core.models.qwen_arch import QWEN25_VL_7B_CONFIG
from trainer_core.planner import GIB, PlanInputs, plan_phases
from trainer_core.planner.captioning import CAPTION_INSTRUCTION_TOKENS, caption_terms
from trainer_core.planner.inference import TEMPLATE_TOKENS
from trainer_core.planner.phases import PHASES
from trainer_core.planner.references import TEMPLATE_TOKENS_PER_REFERENCE

# (family, transformers class and config, the real processor's patch and pixel bounds)
MODELS = {
    "qwen-image": (Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLConfig, QWEN25_VL_7B_CONFIG, 14,
                   QWEN25_VL_MIN_PIXELS, QWEN25_VL_MAX_PIXELS),
    "qwen-image-2.1": (Qwen3VLForConditionalGeneration, Qwen3VLConfig, QWEN3_VL_8B_CONFIG, 16, 65536, 16777216),
}


def term(phase_or_terms, name) -> int:
    terms = phase_or_terms.gpu if hasattr(phase_or_terms, "gpu") else phase_or_terms
    (found,) = [t.bytes for t in terms if t.name == name]
    return found


def resolved(storage: str, **fields) -> PlanInputs:
    return PlanInputs(caption=True, caption_storage=storage, **fields)


@pytest.mark.parametrize("model", MODELS)
def test_weights_are_the_whole_model_language_vision_and_head_at_their_storage(model):
    cls, config_cls, config, *_ = MODELS[model]
    with torch.device("meta"):
        vlm = cls(config_cls(**config))
    language = sum(p.numel() for p in vlm.model.language_model.parameters())
    vision = sum(p.numel() for p in vlm.model.visual.parameters())
    head = vlm.lm_head.weight.numel()
    assert language + vision + head == sum(p.numel() for p in vlm.parameters())  # nothing else, nothing tied
    linears = sum(m.weight.numel() for n, m in vlm.model.language_model.named_modules()
                  if isinstance(m, torch.nn.Linear) and n.startswith("layers."))
    family = get_family(model)
    parts = family.planned_caption_parts()
    bf16 = term(caption_terms(resolved("bfloat16"), parts), "VL model weights")
    one_byte = term(caption_terms(resolved("float8"), parts), "VL model weights")
    assert bf16 == (language + vision + head) * 2
    assert one_byte == (language + vision + head - linears) * 2 + linears  # only the decoder Linears in one byte
    # What training's plan loads from the same file: 1.x the language model alone, 2.1 all but the head.
    trained = family.planned_parts(text_encoder_file=True).text_encoder_params
    assert trained == (language if model == "qwen-image" else language + vision)


@pytest.mark.parametrize("model", MODELS)
def test_kv_cache_and_image_tokens_follow_the_real_config_and_processor(model):
    _, _, config, patch, min_pixels, max_pixels = MODELS[model]
    text = config["text_config"]
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    processor = Qwen2VLImageProcessorPil(patch_size=patch, temporal_patch_size=2, merge_size=2,
                                         min_pixels=min_pixels, max_pixels=max_pixels)
    parts = get_family(model).planned_caption_parts()
    for size, new in (((1024, 1024), 320), ((1024, 576), 64)):
        grid = processor(np.zeros((size[1], size[0], 3), np.uint8), return_tensors="pt")["image_grid_thw"][0]
        vision_tokens = int(grid.prod()) // 4  # merged 2 x 2
        prompt = vision_tokens + CAPTION_INSTRUCTION_TOKENS + TEMPLATE_TOKENS_PER_REFERENCE + TEMPLATE_TOKENS
        terms = caption_terms(resolved("bfloat16", caption_image=size, caption_tokens=new), parts)
        kv = text["num_hidden_layers"] * 2 * text["num_key_value_heads"] * head_dim * (prompt + new) * 2
        assert term(terms, "KV cache") == kv
        assert term(terms, "KV cache growth") == kv // (2 * text["num_hidden_layers"])
        assert term(terms, "logits") == text["vocab_size"] * (2 + 4 + 4)
        assert f"({vision_tokens} vision tokens) in a prompt of {prompt} tokens" in term_note(terms, "prefill forward")
    assert (parts.vision_min_pixels, parts.vision_max_pixels) == (min_pixels, max_pixels)


def term_note(terms, name) -> str:
    (note,) = [t.note for t in terms if t.name == name]
    return note


def test_prefill_is_the_larger_of_the_tower_and_the_language_model_and_one_byte_adds_an_upcast():
    parts = get_family("qwen-image").planned_caption_parts()
    bf16, fp8 = caption_terms(resolved("bfloat16"), parts), caption_terms(resolved("float8"), parts)
    assert term(bf16, "largest weight upcast") == 0
    assert term(fp8, "largest weight upcast") == parts.text_intermediate * parts.text_hidden * 2
    for name in ("prefill forward", "KV cache", "logits"):  # the storage changes the weights only
        assert term(bf16, name) == term(fp8, name)
    assert term(caption_terms(resolved("bfloat16", caption_image=(512, 512)), parts), "prefill forward") < \
        term(bf16, "prefill forward")


def test_caption_phase_only_when_asked_and_the_rest_of_the_plan_unchanged():
    # (28 swapped: the planner's choice at 16 GiB with the measured 7% allocator slack, planner/measured_terms.py)
    common = dict(blocks_to_swap=28, text_encoder_storage="auto")
    plain = plan_phases(PlanInputs(**common), ram_bytes=32 * GIB, gpu_budget_bytes=16 * GIB)
    asked = plan_phases(PlanInputs(caption=True, **common), ram_bytes=32 * GIB, gpu_budget_bytes=16 * GIB)
    assert tuple(plain.phases) == PHASES and "caption" not in plain.phases
    assert tuple(asked.phases) == ("load", "caption", *PHASES[1:])
    for name in PHASES:
        assert asked.phases[name] == plain.phases[name]
    # At 16 GiB caching keeps bf16 while captioning keeps the fp8 file's Linears (its model is larger): each decides
    # alone.
    assert plain.inputs.text_encoder_storage == asked.inputs.text_encoder_storage == "bfloat16"
    assert asked.inputs.caption_storage == "float8"
    assert dataclasses.replace(asked.inputs, caption=False, caption_storage="auto") == plain.inputs
    assert asked.fits and asked.phases["caption"].gpu_bytes <= 16 * GIB


def test_a_caption_phase_that_does_not_fit_refuses_the_plan_and_names_the_one_byte_file():
    # The bf16 file; caching streams what it must.
    inputs = PlanInputs(caption=True, blocks_to_swap=40, text_encoder_file_fp8=False, text_encoder_streamed=None)
    plan = plan_phases(inputs, ram_bytes=32 * GIB, gpu_budget_bytes=12 * GIB)
    assert plan.inputs.caption_storage == "bfloat16" and not plan.fits
    assert [s.phase for s in plan.shortfalls()] == ["caption"]  # caching fits: it streams its layers
    assert plan.suggestions[0].startswith("text encoder in one byte while captioning (its one-byte Linears kept, "
                                          "with the qwen_2.5_vl_7b_fp8_scaled file)")
    # Qwen-Image 2.1's one-byte Qwen3-VL-8B misses 12 GiB by its prefill: a smaller caption image fits.
    family = get_family("qwen-image-2.1")
    plan = plan_phases(PlanInputs(caption=True, blocks_to_swap=20, text_encoder_streamed=None), family.planned_arch(),
                       32 * GIB, 12 * GIB, family.planned_parts(), caption_parts=family.planned_caption_parts())
    assert [s.phase for s in plan.shortfalls()] == ["caption"] and plan.inputs.caption_storage == "float8"
    assert any(line.startswith("caption images shown at most 768x768 px") for line in plan.suggestions)


def test_plan_command_prints_the_caption_phase_and_its_terms(capsys):
    from trainer_core.runs.cli import main

    assert field_default(PlanConfig, "caption_tokens") == PlanInputs().caption_tokens
    assert main(["plan", "--model", "qwen-image-2.1", "--budget-gb", "24", "--caption", "--caption-tokens", "64"]) == 0
    out = capsys.readouterr().out
    assert "VL model bfloat16 while captioning" in out
    (row,) = [line for line in out.splitlines() if line.startswith("caption ")]
    assert " fits " in row and "does NOT fit" not in row and "up to 64 new tokens" in row
    assert "The caption phase, term by term" in out and "36 layers x 8 KV heads x 128" in out
    assert main(["plan", "--model", "qwen-image-2.1", "--budget-gb", "24"]) == 0
    assert "caption" not in capsys.readouterr().out


def test_the_defaults_are_the_captioners():
    """The planned image and caption length are what trainer_core/captions does by default: an image shown at most
    MAX_IMAGE_PIXELS, and its longest style's default caption."""
    from trainer_core.captions.generate import MAX_IMAGE_PIXELS
    from trainer_core.captions.prompts import DEFAULT_MAX_NEW_TOKENS

    p = PlanInputs()
    assert p.caption_image[0] * p.caption_image[1] == MAX_IMAGE_PIXELS
    assert p.caption_tokens == max(DEFAULT_MAX_NEW_TOKENS.values()) == field_default(PlanConfig, "caption_tokens")
