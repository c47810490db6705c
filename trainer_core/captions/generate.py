"""One image's caption: the chat turn through the model's processor, transformers' own `generate`, the answer decoded.

The messages are one user turn, the image then the instruction; the processor's chat template renders them with the
assistant's turn opened (`add_generation_prompt=True`), tokenizes the text and turns the image into the vision
tower's patches (its `<|image_pad|>` repeated once per merged patch). Decoding is transformers' `generate` on the
model itself (no loop of ours): greedy unless a seed asks for sampling, stopping at the end of the assistant's turn.

Shapes: input_ids and attention_mask (1, L); pixel_values (P, C * T * p * p) for P patches of the image;
image_grid_thw (1, 3) = (T, H / p, W / p) patches; generated ids (1, L + n) of which the n after L are the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from PIL import Image

from ..core.command_config import GREEDY
from ..models.vision_language import VisionLanguageModel

# The most pixels an image is shown to the model at (it keeps its aspect ratio): about 1024 x 1024 px, 1337 vision
# tokens for Qwen2.5-VL (28 px per token), 1024 for Qwen3-VL (32 px). The processors' own limit (12.8 and 16.8 MP)
# would spend a 4096 px photo's 20 000 tokens on what a caption does not need.
MAX_IMAGE_PIXELS = 1024 * 1024
SAMPLING = dict(temperature=0.7, top_p=0.9)  # a seed's sampling: Qwen-VL's usual, varied yet on topic


@dataclass(frozen=True)
class Decoding:
    """How tokens are chosen: greedily (`seed` GREEDY: the same answer every time) or sampled with `seed`."""

    max_new_tokens: int
    seed: int = GREEDY
    # At least this many tokens before the turn may end: 0 for real captions; tests of random tiny models set it so
    # that an early end-of-turn token cannot make a caption empty.
    min_new_tokens: int = 0


def shown_image(image: Image.Image, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """`image` in RGB, scaled down (never up: the processor enlarges what is too small itself) to `max_pixels`."""
    image = image.convert("RGB")
    scale = (max_pixels / (image.width * image.height)) ** 0.5
    if scale >= 1:
        return image
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, Image.Resampling.BICUBIC)


def chat_messages(images: list[Image.Image], instruction: str) -> list[dict]:
    """One user turn: the images in order (one, or an edit's controls then its target), then the instruction."""
    return [{"role": "user", "content": [*({"type": "image", "image": image} for image in images),
                                         {"type": "text", "text": instruction}]}]


def chat_inputs(vlm: VisionLanguageModel, images: list[Image.Image], instruction: str) -> dict[str, torch.Tensor]:
    """The model's inputs for `images` and `instruction` (module docstring: shapes; P counts every image's patches,
    image_grid_thw has a row per image), on its device, the pixels in its dtype."""
    return batch_inputs(vlm, [images], instruction)


def batch_inputs(vlm: VisionLanguageModel, batch: list[list[Image.Image]], instruction: str
                 ) -> dict[str, torch.Tensor]:
    """The inputs of several chat turns at once, one row each (input_ids and attention_mask (B, L): the shorter
    prompts padded on the left, so that every row's answer starts at L; the images' patches of every row in one
    pixel_values, image_grid_thw a row per image), on the model's device, the pixels in its dtype."""
    tokenizer = vlm.processor.tokenizer
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        inputs = vlm.processor.apply_chat_template([chat_messages(images, instruction) for images in batch],
                                                   add_generation_prompt=True, tokenize=True, return_dict=True,
                                                   return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side = side
    dtype = next(vlm.model.parameters()).dtype
    return {k: v.to(vlm.device, dtype if v.is_floating_point() else None) for k, v in inputs.items()}


def generate_ids(vlm: VisionLanguageModel, inputs: dict[str, torch.Tensor], decoding: Decoding) -> torch.Tensor:
    """The answers' token ids (B, n): transformers' `generate` on the model, after the prompts' L tokens (a row that
    ended early is padded with the pad token, which decoding leaves out)."""
    sample = decoding.seed != GREEDY
    options = dict(max_new_tokens=decoding.max_new_tokens, min_new_tokens=decoding.min_new_tokens, do_sample=sample,
                   eos_token_id=list(vlm.stop_token_ids) or None,
                   pad_token_id=(vlm.pad_token_id if vlm.pad_token_id is not None
                                 else next(iter(vlm.stop_token_ids), None)))
    if sample:
        options.update(SAMPLING)
    devices = [vlm.device] if vlm.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.inference_mode():
        if sample:
            torch.manual_seed(decoding.seed)  # a batch's draw depends on the seed alone, not on the batches before
        out = vlm.model.generate(**inputs, **options)
    return out[:, inputs["input_ids"].shape[1]:]


def decode(vlm: VisionLanguageModel, ids: torch.Tensor) -> str:
    """The answer's text (special tokens, the end of the turn among them, left out)."""
    return vlm.processor.batch_decode(ids[None].cpu(), skip_special_tokens=True)[0]


def answer(vlm: VisionLanguageModel, images: list[Image.Image], instruction: str, decoding: Decoding
           ) -> tuple[torch.Tensor, str]:
    """(token ids, text) of the model's answer to `instruction` about `images` (each shown at most MAX_IMAGE_PIXELS)."""
    return answers(vlm, [images], instruction, decoding)[0]


def answers(vlm: VisionLanguageModel, batch: list[list[Image.Image]], instruction: str, decoding: Decoding,
            max_pixels: int = MAX_IMAGE_PIXELS) -> list[tuple[torch.Tensor, str]]:
    """[(token ids, text)] of the model's answers to `instruction`, one per entry of `batch` (an entry's images in
    order, each shown at most `max_pixels`), from one `generate` call over the batch."""
    shown = [[shown_image(i, max_pixels) for i in images] for images in batch]
    ids = generate_ids(vlm, batch_inputs(vlm, shown, instruction), decoding)
    return [(row, decode(vlm, row)) for row in ids]
