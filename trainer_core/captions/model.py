"""The captioner's model: the text encoder file read back as its whole vision-language model, and freed after.

The file is the one the Load node reads (ComfyUI's `qwen_2.5_vl_7b*` for Qwen-Image 1.x, `qwen3vl_8b_*` for 2.1: bf16,
scaled float8 or int8 ConvRot, dequantized to the compute dtype while reading). Which reader takes it is the families'
answer: each registered family package that reads a vision-language encoder offers `vision_language_model`
(families/registry.py), and the first that recognises the file builds it, with the vision tower and the real lm_head
the training path leaves out. This module names no family.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from ..core.errors import UserInputError
from ..families.registry import packages
from ..models.layouts import describe_contents
from ..models.safetensors_file import SafetensorsFile
from ..models.source import resolve_compute_dtype
from ..models.vision_language import VisionLanguageModel

CHOOSE = ("Choose ComfyUI's qwen_2.5_vl_7b_fp8_scaled.safetensors or qwen_2.5_vl_7b.safetensors (Qwen-Image, Edit, "
          "Layered) or qwen3vl_8b_int8_convrot.safetensors (Qwen-Image 2.1) from models/text_encoders.")


def load_vision_language_model(text_encoder: str | Path, tokenizer_dir: str | Path | None = None,
                               device: str | torch.device = "cpu", compute_dtype: str = "auto",
                               fp8: str = "auto", caption_image: tuple[int, int] = (1024, 1024),
                               caption_tokens: int = 0) -> VisionLanguageModel:
    """The vision-language model of `text_encoder` (a file path) on `device`, frozen, in eval mode, with its processor
    (the tokenizer from `tokenizer_dir`, else the `tokenizer/` folder beside the file). `compute_dtype`: "auto"
    (bfloat16 on a GPU, float32 on a CPU) or a torch dtype's name. `fp8`: a one-byte file's Linears "keep" or
    "dequantize", or "auto": kept where the bf16 model would not fit the GPU (planner/captioning.py), else dequantized.
    `caption_image` (the largest image shown, W x H px) and `caption_tokens` (the longest caption) size the memory
    plan's captioning phase, which refuses on a GPU, before anything loads, what would not fit."""
    device = torch.device(device)
    dtype = resolve_compute_dtype(compute_dtype, device)
    path = Path(text_encoder).expanduser()
    file = SafetensorsFile(path, "text encoder")  # a missing or unreadable file is refused here, by name
    for package in packages():
        build = getattr(package, "vision_language_model", None)
        vlm = (build(path, tokenizer_dir, dtype, device, fp8, caption_image, caption_tokens)
               if build is not None else None)
        if vlm is not None:
            return vlm
    raise UserInputError(f"text encoder file {path} is not a vision-language text encoder that can write captions: it "
                         f"looks like {describe_contents(file.keys)}. {CHOOSE}")


@contextlib.contextmanager
def vision_language_model(text_encoder: str | Path, tokenizer_dir: str | Path | None = None,
                          device: str | torch.device = "cpu", compute_dtype: str = "auto",
                          fp8: str = "auto", caption_image: tuple[int, int] = (1024, 1024),
                          caption_tokens: int = 0) -> Iterator[VisionLanguageModel]:
    """`load_vision_language_model` for a `with` block, released at its end whatever happens (an interrupt too): the
    encoder's memory is free for caching and training after, as the Cache node frees its text encoder."""
    vlm = load_vision_language_model(text_encoder, tokenizer_dir, device, compute_dtype, fp8, caption_image,
                                     caption_tokens)
    try:
        yield vlm
    finally:
        vlm.release()
