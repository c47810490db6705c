"""Qwen-Image 2.1's text encoder file as the Qwen3-VL that writes captions (trainer_core/captions asks this package's
`vision_language_model`, families/registry.py).

The file (ComfyUI's `qwen3vl_8b_*.safetensors`: bf16, scaled float8 or int8 ConvRot) is read by text_file.py with
its real `model.lm_head` (`head=True`) and its vision tower; the processor is processor.py's (Qwen3-VL's image
statistics, the vision tower's patch and merge sizes) around the Qwen tokenizer beside the file or named by the
caller. Qwen3-VL's published chat template adds no system turn, so processor.py's Qwen chat format renders a caption
request (one user turn: the image, then the instruction) exactly as the real one does.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...core.errors import UserInputError
from ...models.safetensors_file import SafetensorsFile
from ...models.tokenizer import load_tokenizer
from ...models.vision_language import VisionLanguageModel, holds_one_byte_linears, on_device, stop_ids

QWEN3_PROBE = "layers.0.self_attn.q_norm.weight"  # Qwen3's per-head query norm: Qwen2.5's layers have none
VISION_PREFIXES = ("visual.", "model.visual.")


def is_qwen3_vl_file(file: SafetensorsFile) -> bool:
    return any(k.endswith(QWEN3_PROBE) for k in file.keys)


def vision_language_model(path: str | Path, tokenizer_dir: str | Path | None = None,
                          compute_dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                          fp8: str = "auto", caption_image: tuple[int, int] = (1024, 1024),
                          caption_tokens: int = 0) -> VisionLanguageModel | None:
    """The Qwen3-VL of a 2.1 text encoder file, with its head and vision tower, on `device`; None when the file is not
    a Qwen3-VL text encoder (another package's, or no text encoder: the captioner says so)."""
    from .processor import build_processor
    from .text_file import load_qwen3_vl_file

    file = SafetensorsFile(path, "text encoder")
    if not is_qwen3_vl_file(file):
        return None
    if not any(k.startswith(VISION_PREFIXES) for k in file.keys):
        raise UserInputError(f"text encoder file {file.path} is a Qwen3-VL language model without its vision tower "
                             "(visual.*), so it cannot see the images it should caption. Choose ComfyUI's "
                             "qwen3vl_8b_int8_convrot.safetensors (or its bf16 / fp8 file): they carry it.")
    from ...planner.device import resolve_caption_fp8
    from .plan import real_parts21

    parts = real_parts21(lm_head=True)
    # one byte kept where bf16 would not fit the GPU (planner/captioning.py); refused before loading where nothing fits
    fp8 = resolve_caption_fp8(fp8, device, parts, holds_one_byte_linears(file), caption_image, caption_tokens)
    model = load_qwen3_vl_file(file.path, compute_dtype, fp8, placement=on_device(device), head=True)
    tokenizer = load_tokenizer(tokenizer_dir, file.path, model.config.text_config.vocab_size)
    return VisionLanguageModel(model=model, processor=build_processor(tokenizer, model.config.vision_config),
                               name=f"Qwen3-VL ({file.path.name})", stop_token_ids=stop_ids(tokenizer),
                               pad_token_id=tokenizer.pad_token_id, planned_parts=parts, one_byte=fp8 == "keep")
