"""The Qwen2.5-VL processor the edit pipelines feed the text encoder through, built offline.

A diffusers folder of Qwen-Image-Edit carries `processor/` (preprocessor_config.json); ComfyUI's files carry
none. Both are the Qwen2.5-VL 7B processor, whose preprocessor_config.json says: min_pixels 3136,
max_pixels 12845056, patch 14, temporal patch 2, merge 2, CLIP mean/std, bicubic resampling, rescale
1/255. The patch, temporal patch and merge sizes are the vision tower's own (its config), so a tiny
tower gets a processor that fits it; the pixel limits and statistics are the real processor's.

It is built as models/vision_processor.py builds a Qwen-VL processor offline (no video processor).
"""

from __future__ import annotations

from transformers import Qwen2VLProcessor

from ...models.vision_processor import image_only_processor

# Qwen/Qwen2.5-VL-7B-Instruct preprocessor_config.json (what the Qwen-Image-Edit folders ship as processor/).
QWEN25_VL_MIN_PIXELS = 3136
QWEN25_VL_MAX_PIXELS = 12845056
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def build_processor(tokenizer, vision_config):
    """The processor for `tokenizer` and a Qwen2.5-VL vision tower with `vision_config`."""
    return image_only_processor(Qwen2VLProcessor, tokenizer, vision_config, QWEN25_VL_MIN_PIXELS,
                                QWEN25_VL_MAX_PIXELS, CLIP_MEAN, CLIP_STD)
