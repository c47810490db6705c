"""A text encoder file read back as the vision-language model it was cut from, for generating words (captioning).

ComfyUI's text encoder files hold a whole Qwen-VL model: the language model, the vision tower and the `lm_head`
(Qwen-Image 1.x's Qwen2.5-VL 7B, Qwen-Image 2.1's Qwen3-VL 8B). Training reads only hidden states from them; a
captioner needs all three. Which family's reader takes a file is the families' answer (each family package that
reads a vision-language encoder offers `vision_language_model`, families/registry.py); this module holds what they
hand back, which the captioner (trainer_core/captions) uses without knowing the family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..core.host_memory import give_back_freed_memory


@dataclass
class VisionLanguageModel:
    """A transformers `...ForConditionalGeneration` model with its real head and vision tower, and its processor.

    `processor` takes `apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
    return_tensors="pt")` with one image part per image, and decodes generated ids (`batch_decode`).
    `stop_token_ids`: the ids a turn ends with (`<|im_end|>`, and `<|endoftext|>` where the tokenizer has it).
    """

    model: nn.Module
    processor: Any
    name: str  # what messages call it: "Qwen2.5-VL (qwen_2.5_vl_7b_fp8_scaled.safetensors)"
    stop_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    # What the memory plan needs to size a batch of images (planner/captioning.py): the whole model's planned parts
    # (`ModelFamily.planned_caption_parts`; None: unplanned, one image at a time) and whether the file's one-byte
    # Linears are kept.
    planned_parts: Any = None
    one_byte: bool = False
    release_hook: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def release(self) -> None:
        """Drop the weights (the model is unusable after): the encoder's memory is free for what comes next, as
        caching frees the text encoder."""
        device = self.device
        self.model.to("meta")
        if self.release_hook is not None:
            self.release_hook()
        give_back_freed_memory()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def on_device(device: torch.device | str):
    """A `text_encoder_file.Placement` that reads every tensor straight to `device` (no whole copy in host memory
    first) and moves the buffers (RoPE) there after."""
    device = torch.device(device)

    def placement(model: nn.Module):
        return (lambda name: device), (lambda filled: filled.to(device))

    return placement


def holds_one_byte_linears(file) -> bool:
    """Whether a text encoder file (a `SafetensorsFile`) stores Linear weights in one byte (scaled float8, int8
    ConvRot): the captioner may keep them so (`text_encoder_fp8`)."""
    return any(file.dtype(k) in (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
               for k in file.keys if k.endswith(".weight"))


def stop_ids(tokenizer, tokens: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")) -> tuple[int, ...]:
    """The ids of `tokens` the tokenizer knows (Qwen's chat turn ends with <|im_end|>)."""
    ids = [tokenizer.convert_tokens_to_ids(t) for t in tokens]
    return tuple(i for i in ids if i is not None and i != tokenizer.unk_token_id)
