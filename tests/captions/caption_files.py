"""The captions room's shared files, written once (tests import the fixture from here): the two tiny
vision-language text encoders as ComfyUI's files.

Each is the devtools writer's random file in the exact key layout ComfyUI ships (scaled float8 Linears with their
`scale_weight`, `visual.*`, the head: `lm_head` for Qwen2.5-VL, `model.lm_head` for Qwen3-VL), seeded, with its config
JSON beside it (the tiny configs of models/tiny.py and qwen_image21/tiny.py) and the tiny Qwen tokenizer in
`tokenizer/` beside it, where the captioner looks.
"""

from __future__ import annotations

import pytest
from PIL import Image

QWEN25_VL, QWEN3_VL = "qwen2.5-vl", "qwen3-vl"


def write_tiny_encoders(folder, whole: bool = True) -> dict:
    """{QWEN25_VL: path, QWEN3_VL: path} in `folder` (`whole` False: Qwen2.5-VL's language model only)."""
    from trainer_core.devtools.random_files import write_random_text_encoder
    from trainer_core.families.qwen_image21.random_files import write_random_qwen3_vl
    from trainer_core.families.qwen_image21.tiny import tiny_text_config as qwen3_config
    from trainer_core.models.tiny import SPECIAL_TOKENS, build_tiny_tokenizer, tiny_text_config

    tokenizer = build_tiny_tokenizer()
    tokenizer.save_pretrained(str(folder / "tokenizer"))
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    return {
        QWEN25_VL: write_random_text_encoder(folder / "qwen_2.5_vl_tiny_fp8_scaled.safetensors",
                                             config=tiny_text_config(len(tokenizer), ids), seed=3, whole=whole),
        QWEN3_VL: write_random_qwen3_vl(folder / "qwen3vl_tiny_fp8_scaled.safetensors", seed=4,
                                        config=qwen3_config(len(tokenizer), ids)),
    }


@pytest.fixture(scope="session")
def tiny_encoders(tmp_path_factory):
    return write_tiny_encoders(tmp_path_factory.mktemp("caption_encoders"))


def picture(width: int, height: int, colour: tuple[int, int, int]) -> Image.Image:
    """A small test picture: a colour with a white square in it (not one flat colour)."""
    image = Image.new("RGB", (width, height), colour)
    image.paste((255, 255, 255), (width // 4, height // 4, width // 2, height // 2))
    return image
