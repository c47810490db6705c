"""Qwen-Image 1.x's text encoder file as the Qwen2.5-VL that writes captions (trainer_core/captions asks this
package's `vision_language_model`, families/registry.py).

Qwen-Image, Edit and Layered share ComfyUI's `qwen_2.5_vl_7b*.safetensors`; this package is the one that already
sees images through it (its vision tower and processor.py's Qwen2.5-VL processor), so it answers for all three. The
file is read by models/text_encoder_file.py with `visual.*` and its real `lm_head` (`vision=True, head=True`;
training's path reads neither); the tokenizer is the Qwen2.5 one beside the file or named by the caller, as for
training. The processor gets Qwen2.5-VL's published chat template (its chat_template.json), which opens with the
default system turn "You are a helpful assistant." when the messages bring none.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...core.errors import UserInputError
from ...models.layouts import TEXT_ENCODER_PREFIXES, TEXT_ENCODER_PROBES, find_prefix
from ...models.safetensors_file import SafetensorsFile
from ...models.tokenizer import load_tokenizer
from ...models.vision_language import VisionLanguageModel, holds_one_byte_linears, on_device, stop_ids

QWEN3_PROBE = "self_attn.q_norm.weight"  # a Qwen3 language model's (Qwen-Image 2.1's encoder): not this package's

# Qwen/Qwen2.5-VL-7B-Instruct's chat_template.json, verbatim.
QWEN25_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content "
    "or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' "
    "or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)


def vision_language_model(path: str | Path, tokenizer_dir: str | Path | None = None,
                          compute_dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                          fp8: str = "auto", caption_image: tuple[int, int] = (1024, 1024),
                          caption_tokens: int = 0) -> VisionLanguageModel | None:
    """The Qwen2.5-VL of a 1.x text encoder file, with its head and vision tower, on `device`; None when the file is
    no Qwen2.5-VL text encoder (another package's, or no text encoder at all: the captioner says so)."""
    from ...models.text_encoder_file import TextEncoderFile
    from .processor import build_processor

    file = SafetensorsFile(path, "text encoder")
    prefix = find_prefix(file.keys, TEXT_ENCODER_PROBES, TEXT_ENCODER_PREFIXES)
    if prefix is None or any(k.endswith(QWEN3_PROBE) for k in file.keys):
        return None
    if not any(k.startswith((prefix + "visual.", prefix + "model.visual.")) for k in file.keys):
        raise UserInputError(f"text encoder file {file.path} is a Qwen2.5-VL language model without its vision tower "
                             "(visual.*), so it cannot see the images it should caption. Choose ComfyUI's "
                             "qwen_2.5_vl_7b_fp8_scaled.safetensors or qwen_2.5_vl_7b.safetensors: they carry it.")
    from ...planner.captioning import qwen25_vl_parts
    from ...planner.device import resolve_caption_fp8

    # the one-byte Linears kept where the bf16 model would not fit the GPU (planner/captioning.py)
    fp8 = resolve_caption_fp8(fp8, device, qwen25_vl_parts(), holds_one_byte_linears(file), caption_image,
                              caption_tokens)  # (refused here, before loading, where the plan does not fit the GPU)
    model = TextEncoderFile(file.path, compute_dtype, fp8, vision=True, head=True)(on_device(device))
    tokenizer = load_tokenizer(tokenizer_dir, file.path, model.config.text_config.vocab_size)
    processor = build_processor(tokenizer, model.config.vision_config)
    processor.chat_template = QWEN25_VL_CHAT_TEMPLATE
    return VisionLanguageModel(model=model, processor=processor, name=f"Qwen2.5-VL ({file.path.name})",
                               stop_token_ids=stop_ids(tokenizer), pad_token_id=tokenizer.pad_token_id,
                               planned_parts=qwen25_vl_parts(), one_byte=fp8 == "keep")
