"""The captioning phase, term by term (phases.py adds it to a plan when `PlanInputs.caption` asks: `plan --caption`).

The captioner (issue 42: trainer_core/captions) builds the vision-language model the text encoder file was cut from,
whole: the language model, its vision tower and its `lm_head` (Qwen2.5-VL-7B from ComfyUI's `qwen_2.5_vl_7b*` file for
Qwen-Image 1.x, Edit and Layered; Qwen3-VL-8B from `qwen3vl_8b_*` for 2.1), on the device, alone (before caching, freed
after it), and for one image at a time runs transformers' `generate`: one prefill forward of the chat turn (template,
the image's vision tokens, the instruction), then up to `caption_tokens` decode steps of one token each, over a
`DynamicCache` (per decoder layer keys and values, (batch, KV heads, tokens, head dim) in the compute dtype; a step
appends with `torch.cat`, the longer copy made while the shorter is alive). transformers 5's `generate` asks the model
for the last position's logits only (`logits_to_keep=1`) and copies them to float32.

    weights      every parameter in the compute dtype (bf16), or with the one-byte file's decoder Linears kept in one
                 byte (`caption_storage` float8: scaled fp8 or int8, as caching keeps them); the vision tower, the
                 embeddings and lm_head in the compute dtype either way (as caching plans a kept tower)
    upcast       one decoder Linear dequantized for its matmul (one-byte storage only)
    prefill      the vision tower's forward on the image, then the language model's over the whole prompt: counted as
                 caching counts a prompt with images (references.vision_bytes, inference.text_encoder_working_bytes),
                 which keeps every hidden state, as the training pipeline asks; `generate` asks for none, so this
                 term is on the safe side (by what `kept_hidden_bytes` says)
    KV cache     layers x 2 x KV heads x head dim x (prompt + caption_tokens) x compute bytes, full (summed with the
                 prefill's transients, which are gone by then: on the safe side by the new tokens' share)
    KV growth    one layer's keys, copied longer by `torch.cat` while the shorter is alive
    logits       the last position's logits in the compute dtype, their float32 copy and the float32 scores after
                 the logits processors
With `caption_batch` images in one `generate` call (the captioner's batch), every term but the weights and the upcast
is per image: times the batch (the tower sees every image's patches at once; each row has its own prompt, cache and
logits; a row shorter than the longest is padded, on the safe side here, as every image is planned at the largest).
Host RAM: as caching's prompts step, the process and one tensor in flight from the file (the model is read straight
to the device). Decoding's per-token transients (one token through a layer) are below a megabyte: not counted.

The image: the captioner shows it at most `MAX_IMAGE_PIXELS` (1024 x 1024 px, its aspect kept: captions/generate.py);
the processor fits that to its tower's grid with its own pixel bounds (`smart_resize`, factor patch x merge), so a
1024 x 1024 image is 1036 x 1036 px for Qwen2.5-VL (28 px grid: 1369 vision tokens) and 1024 x 1024 for Qwen3-VL (32 px:
1024 tokens). `PlanInputs.caption_image` is what the captioner hands the processor (default 1024 x 1024).
"""

from __future__ import annotations

import dataclasses
import functools

from .inference import TEMPLATE_TOKENS, PartSizes, encoder_fields, real_parts, text_encoder_working_bytes
from .phase import HOST_RESERVE_BYTES, Phase, baseline, on_device
from .plan import DTYPE_BYTES, GIB, PlanInputs, Term
from .references import patches, prompt_tokens, slots, vision_bytes

# The instruction's tokens (the user turn's text besides the image): the "detailed" style's instruction is about 75
# tokens, a trigger word and a "do not mention ..." clause add some; rounded up. The chat template's own tokens
# (system turn, role markers, ~30) are inference.TEMPLATE_TOKENS (40), the image's markers TEMPLATE_TOKENS_PER_REFERENCE.
CAPTION_INSTRUCTION_TOKENS = 96
LOGITS_BYTES_PER_ENTRY_FP32 = 4 + 4  # generate's float32 copy of the last logits + the processed scores


@functools.lru_cache(maxsize=1)
def qwen25_vl_parts() -> PartSizes:
    """Qwen2.5-VL-7B whole, as the captioner builds it from ComfyUI's `qwen_2.5_vl_7b*` file (language model, vision
    tower, lm_head), counted on the meta device; Qwen-Image's measured constants (`real_parts`)."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from ..models.qwen_arch import QWEN25_VL_7B_CONFIG

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**QWEN25_VL_7B_CONFIG))
    return dataclasses.replace(real_parts(), **encoder_fields(model))


def caption_view(parts: PartSizes, size: tuple[int, int]) -> tuple[int, int]:
    """(W, H) px the processor resizes a (W, H) image to: its tower's grid (patch x merge px) within its pixel bounds,
    as transformers' Qwen2-VL `smart_resize` (Qwen2.5-VL's and Qwen3-VL's processors both use it)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    h, w = smart_resize(size[1], size[0], factor=parts.vision_patch * parts.vision_merge,
                        min_pixels=parts.vision_min_pixels, max_pixels=parts.vision_max_pixels)
    return int(w), int(h)


def caption_prompt_tokens(p: PlanInputs, parts: PartSizes) -> int:
    """Tokens of the prefill: the chat template, the image's markers and vision tokens, the instruction."""
    view = caption_view(parts, p.caption_image)
    seen = dataclasses.replace(p, text_tokens=CAPTION_INSTRUCTION_TOKENS, reference_sizes=(view,))
    return prompt_tokens(seen, parts) + TEMPLATE_TOKENS


def kv_cache_bytes(parts: PartSizes, tokens: int, act: int) -> int:
    """A DynamicCache's keys and values of `tokens` tokens over every decoder layer (batch 1)."""
    return parts.text_layers * 2 * parts.text_kv_heads * parts.text_head_dim * tokens * act


def weights_bytes(parts: PartSizes, storage: str, act: int) -> int:
    """The whole model's weights: every parameter in the compute dtype, less a byte per decoder Linear weight short of
    it when the one-byte file's Linears are kept (`storage` float8)."""
    return parts.text_encoder_params * act - (parts.text_encoder_linear_params * (act - 1) if storage == "float8" else 0)


def kept_hidden_bytes(p: PlanInputs, parts: PartSizes) -> int:
    """The hidden states the prefill term counts and `generate` does not keep: the tower's depth + 1 states of the
    image's patches and the language model's layers + 1 states of the prompt (how far the term is on the safe side)."""
    act = DTYPE_BYTES[p.compute_dtype]
    n = patches(parts, caption_view(parts, p.caption_image))
    return ((parts.vision_layers + 1) * n * parts.vision_hidden
            + (parts.text_layers + 1) * caption_prompt_tokens(p, parts) * parts.text_hidden) * act


def caption_terms(p: PlanInputs, parts: PartSizes) -> list[Term]:
    """The captioning phase's device terms for `p.caption_batch` images at once, with the model's weights at `p.caption_storage` (resolved:
    bfloat16 or float8). `parts`: the whole vision-language model's (a family's `planned_caption_parts`)."""
    if not parts.vision_layers:
        raise ValueError("captioning plans a vision-language model: these parts have no vision tower")
    act = DTYPE_BYTES[p.compute_dtype]
    storage = p.caption_storage
    if storage == "auto":
        raise ValueError("caption_storage 'auto' is resolved before the terms (choose_caption_storage)")
    float8 = storage == "float8"
    view = caption_view(parts, p.caption_image)
    tokens = caption_prompt_tokens(p, parts)
    head = parts.text_logits_per_token * parts.text_hidden
    language = parts.text_encoder_params - parts.vision_params - head
    no_logits = dataclasses.replace(parts, text_logits_per_token=0)  # logits_to_keep=1: the logits term below
    forward = text_encoder_working_bytes(no_logits, tokens - TEMPLATE_TOKENS, act)
    peak, kept = vision_bytes(parts, (view,), act)
    embeddings = tokens * parts.text_hidden * act  # made before the tower runs
    prefill = max(forward + kept, peak + embeddings)
    total = tokens + p.caption_tokens
    vision_tokens = slots(parts, view)
    b = p.caption_batch
    each = f"{b} images, each " if b > 1 else ""
    return [
        Term("VL model weights", weights_bytes(parts, storage, act),
             f"{parts.text_encoder_params / 1e9:.2f}B params (language model {language / 1e9:.2f}B, vision tower "
             f"{parts.vision_params / 1e9:.2f}B, lm_head {head / 1e9:.2f}B), "
             + ("one-byte decoder Linears" if float8 else p.compute_dtype)),
        Term("largest weight upcast", parts.text_intermediate * parts.text_hidden * act if float8 else 0,
             "one byte -> bf16, transient"),
        Term("prefill forward", b * prefill,
             f"{each}one {view[0]}x{view[1]} image ({vision_tokens} vision tokens) in a prompt of {tokens} tokens; the vision "
             f"tower peaks at {(peak + embeddings) / GIB:.2f} GiB, the language model at {(forward + kept) / GIB:.2f}; "
             f"every hidden state counted (generate keeps none: {kept_hidden_bytes(p, parts) / GIB:.2f} GiB to spare)"),
        Term("KV cache", b * kv_cache_bytes(parts, total, act),
             f"{each}{parts.text_layers} layers x {parts.text_kv_heads} KV heads x {parts.text_head_dim}, "
             f"{tokens} + {p.caption_tokens} tokens"),
        Term("KV cache growth", b * kv_cache_bytes(parts, total, act) // (2 * parts.text_layers),
             "one layer's keys copied longer by torch.cat"),
        Term("logits", b * parts.text_logits_per_token * (act + LOGITS_BYTES_PER_ENTRY_FP32),
             "the last position's, its float32 copy and scores"),
    ]


def caption_phase(p: PlanInputs, parts: PartSizes) -> Phase:
    """The captioning phase for `p` (caption_storage resolved) and the whole VL model's `parts`."""
    terms = caption_terms(p, parts)
    in_flight = Term("tensor in flight", parts.text_encoder_largest * DTYPE_BYTES[p.compute_dtype],
                     "the largest tensor, read from the text encoder file")
    weights = "one-byte decoder Linears kept" if p.caption_storage == "float8" else p.compute_dtype
    images = "one image" if p.caption_batch == 1 else f"{p.caption_batch} images at once"
    note = (f"the text encoder file's whole VL model, {weights}; {images}, up to {p.caption_tokens} new tokens; "
            "freed before caching")
    return on_device(p, terms, [baseline(p), in_flight], "caption", note)


def caption_batch_that_fits(p: PlanInputs, parts: PartSizes, gpu_budget_bytes: int, most: int = 8) -> int:
    """The most images (1 to `most`) one `generate` call may caption within `gpu_budget_bytes` (`p.caption_storage`
    resolved); 1 when even one does not fit (the plan's refusal says so, not this)."""
    fitting = [b for b in range(1, most + 1)
               if caption_phase(dataclasses.replace(p, caption_batch=b), parts).gpu_bytes <= gpu_budget_bytes]
    return max(fitting, default=1)


def choose_caption_storage(inputs: PlanInputs, parts: PartSizes, gpu_budget_bytes: int | None = None,
                           ram_bytes: int | None = None) -> str:
    """The VL model's weights while captioning: inputs.caption_storage unless "auto"; then inputs.text_encoder_storage
    unless "auto"; then "bfloat16" when the captioning phase fits with it (the GPU budget; on the CPU, the RAM), else
    "float8" (the one-byte file's Linears kept). A bf16 file has no one-byte Linears: bfloat16. (As caching's
    `choose_text_encoder_storage`, against this phase.)"""
    for asked in (inputs.caption_storage, inputs.text_encoder_storage):
        if asked != "auto":
            return asked
    if not inputs.text_encoder_file_fp8:
        return "bfloat16"
    phase = caption_phase(dataclasses.replace(inputs, caption_storage="bfloat16"), parts)
    if inputs.device == "cuda":
        fits = gpu_budget_bytes is None or phase.gpu_bytes <= gpu_budget_bytes
    else:
        fits = ram_bytes is None or phase.host_bytes <= ram_bytes - HOST_RESERVE_BYTES
    return "bfloat16" if fits else "float8"
