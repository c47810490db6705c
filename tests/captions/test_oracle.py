"""Captions are transformers' own generation: for a tiny Qwen2.5-VL and a tiny Qwen3-VL read from ComfyUI's file
layout, the caption's tokens equal `generate` (greedy) of the same transformers class loaded by transformers itself
(`from_pretrained`) from the same weights, token for token.

The reference folder holds the file's tensors as the format defines them (a scaled float8 weight times its
`scale_weight`: DESIGN §5), under the names the models' published checkpoints use. Qwen2.5-VL's published names are
ComfyUI's own (`model.layers.*`, `visual.*`, `lm_head`: transformers maps them itself); Qwen3-VL's published
checkpoint names the language model `model.language_model.*`, the tower `model.visual.*` and the head `lm_head`,
where ComfyUI's file says `model.*`, `visual.*` and `model.lm_head` (tests/data/comfy_qwen3vl_8b_keys.json).
"""

from __future__ import annotations

import json

import pytest
import torch
from caption_files import QWEN3_VL, QWEN25_VL, picture, tiny_encoders  # noqa: F401 (a fixture)

NEW_TOKENS = 12
INSTRUCTION = "Write a one-line caption for this image."

# ComfyUI's Qwen3-VL names -> the published checkpoint's, first match wins.
QWEN3_PUBLISHED = (("model.lm_head.", "lm_head."), ("visual.", "model.visual."), ("model.", "model.language_model."))


def published_tensors(path, kind: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    stored = load_file(str(path))
    tensors = {}
    for key, value in stored.items():
        if key == "scaled_fp8" or key.endswith(".scale_weight"):
            continue
        scale = stored.get(key[: -len(".weight")] + ".scale_weight") if key.endswith(".weight") else None
        value = value.float() * scale.float() if scale is not None else value.float()
        if kind == QWEN3_VL:
            key = next(theirs + key[len(mine):] for mine, theirs in QWEN3_PUBLISHED if key.startswith(mine))
        tensors[key] = value.contiguous()
    return tensors


def reference_model(path, kind: str, folder):
    """transformers' class loaded by `from_pretrained` from a folder of the file's weights and config."""
    from safetensors.torch import save_file
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen3VLConfig,
                              Qwen3VLForConditionalGeneration)

    config_class, model_class = ((Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration) if kind == QWEN25_VL
                                 else (Qwen3VLConfig, Qwen3VLForConditionalGeneration))
    config_class.from_dict(json.loads(path.with_suffix(".json").read_text())["config"]).save_pretrained(str(folder))
    save_file(published_tensors(path, kind), str(folder / "model.safetensors"), metadata={"format": "pt"})
    model, info = model_class.from_pretrained(str(folder), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


@pytest.mark.parametrize("images", [1, 2], ids=["one image", "an edit's control then its target"])
@pytest.mark.parametrize("kind", [QWEN25_VL, QWEN3_VL])
def test_caption_tokens_are_transformers_generate(kind, images, tiny_encoders, tmp_path):
    from trainer_core.captions.generate import Decoding, answer
    from trainer_core.captions.model import vision_language_model

    pictures = [picture(72, 56, (30, 90, 200)), picture(64, 64, (200, 90, 30))][:images]
    reference = reference_model(tiny_encoders[kind], kind, tmp_path)
    with vision_language_model(tiny_encoders[kind]) as vlm:
        ours, text = answer(vlm, pictures, INSTRUCTION, Decoding(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS))
        # The reference's inputs through the processor's own API (the same chat turn: the images, then instruction).
        messages = [{"role": "user", "content": [*({"type": "image", "image": p} for p in pictures),
                                                 {"type": "text", "text": INSTRUCTION}]}]
        inputs = vlm.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                   return_dict=True, return_tensors="pt")
        stops = list(vlm.stop_token_ids)
    with torch.inference_mode():
        theirs = reference.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                    eos_token_id=stops, pad_token_id=stops[0])
    prompt = inputs["input_ids"].shape[1]
    assert ours.tolist() == theirs[0, prompt:].tolist()
    assert len(ours) == NEW_TOKENS and text  # random weights: gibberish, but words of the vocabulary


@pytest.mark.parametrize("kind", [QWEN25_VL, QWEN3_VL])
def test_the_chat_turn_is_the_published_template(kind, tiny_encoders):
    """One user turn, the image's vision tokens then the instruction, the assistant's turn opened; Qwen2.5-VL's
    published template adds its default system turn, Qwen3-VL's none."""
    from trainer_core.captions.generate import chat_inputs
    from trainer_core.captions.model import vision_language_model

    with vision_language_model(tiny_encoders[kind]) as vlm:
        text = vlm.processor.tokenizer.decode(chat_inputs(vlm, [picture(64, 64, (0, 0, 0))], "Say it.")["input_ids"][0])
    system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" if kind == QWEN25_VL else ""
    assert text.startswith(system + "<|im_start|>user\n<|vision_start|><|image_pad|>")
    assert text.endswith("<|image_pad|><|vision_end|>Say it.<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("kind", [QWEN25_VL, QWEN3_VL])
def test_a_one_byte_file_kept_in_one_byte_writes_the_same_caption(kind, tiny_encoders):
    """text_encoder_fp8 "keep" (what "auto" picks where the bf16 model would not fit the GPU: planner/device.py's
    resolve_caption_fp8, "dequantize" on a CPU) keeps the scaled float8 Linears in one byte and upcasts them per
    forward: the same weights' values, so the same caption, token for token."""
    from trainer_core.captions.generate import Decoding, answer
    from trainer_core.captions.model import vision_language_model
    from trainer_core.families import get_family
    from trainer_core.planner.device import resolve_caption_fp8

    assert resolve_caption_fp8("auto", "cpu", get_family("qwen-image").planned_caption_parts()) == "dequantize"
    pictures, decoding = [picture(72, 56, (30, 90, 200))], Decoding(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    tokens = {}
    for mode in ("keep", "dequantize"):
        with vision_language_model(tiny_encoders[kind], fp8=mode) as vlm:
            stored = {p.dtype for p in vlm.model.parameters()} | {b.dtype for b in vlm.model.buffers()}
            assert (torch.float8_e4m3fn in stored) == (mode == "keep"), stored
            tokens[mode] = answer(vlm, pictures, INSTRUCTION, decoding)[0].tolist()
    assert tokens["keep"] == tokens["dequantize"]


@pytest.mark.parametrize("kind", [QWEN25_VL, QWEN3_VL])
def test_a_batch_of_images_is_transformers_generate_over_the_batch(kind, tiny_encoders, tmp_path):
    """Several images in one call (batch_size): each row's tokens equal transformers' own `generate` over the same
    batch (the shorter prompts padded on the left, the processor's own batching), token for token."""
    from trainer_core.captions.generate import Decoding, answers
    from trainer_core.captions.model import vision_language_model

    batch = [[picture(72, 56, (30, 90, 200))], [picture(40, 96, (200, 90, 30))], [picture(64, 64, (9, 9, 9))]]
    reference = reference_model(tiny_encoders[kind], kind, tmp_path)
    with vision_language_model(tiny_encoders[kind]) as vlm:
        ours = answers(vlm, batch, INSTRUCTION, Decoding(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS))
        messages = [[{"role": "user", "content": [{"type": "image", "image": images[0]},
                                                  {"type": "text", "text": INSTRUCTION}]}] for images in batch]
        vlm.processor.tokenizer.padding_side = "left"
        inputs = vlm.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                   return_dict=True, return_tensors="pt", padding=True)
        vlm.processor.tokenizer.padding_side = "right"
        stops = list(vlm.stop_token_ids)
    assert len(set(inputs["attention_mask"].sum(1).tolist())) > 1  # prompts of different lengths: padding at work
    with torch.inference_mode():
        theirs = reference.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                    eos_token_id=stops, pad_token_id=stops[0])
    prompt = inputs["input_ids"].shape[1]
    assert [ids.tolist() for ids, _text in ours] == theirs[:, prompt:].tolist()
