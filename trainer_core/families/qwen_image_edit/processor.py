"""The Qwen2.5-VL processor the edit pipelines feed the text encoder through, built offline.

A diffusers folder of Qwen-Image-Edit carries `processor/` (preprocessor_config.json); ComfyUI's files carry
none. Both are the Qwen2.5-VL 7B processor, whose preprocessor_config.json says: min_pixels 3136,
max_pixels 12845056, patch 14, temporal patch 2, merge 2, CLIP mean/std, bicubic resampling, rescale
1/255. The patch, temporal patch and merge sizes are the vision tower's own (its config), so a tiny
tower gets a processor that fits it; the pixel limits and statistics are the real processor's.

transformers 5's fast image processor and its video processor need torchvision, which is not installed
beside a CPU torch wheel (DESIGN §9): the processor here uses the PIL image processor and no video
processor (the edit pipelines pass images only).
"""

from __future__ import annotations

# Qwen/Qwen2.5-VL-7B-Instruct preprocessor_config.json (what the Qwen-Image-Edit folders ship as processor/).
QWEN25_VL_MIN_PIXELS = 3136
QWEN25_VL_MAX_PIXELS = 12845056
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
BICUBIC = 3  # PIL.Image.Resampling.BICUBIC


def _processor_class():
    from transformers import Qwen2VLProcessor

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        """Qwen2VLProcessor with an image processor and a tokenizer, no video processor (see the module
        docstring). transformers takes a processor's parts from its __init__ signature."""

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return ImageOnlyQwen2VLProcessor


def build_processor(tokenizer, vision_config):
    """The processor for `tokenizer` and a Qwen2.5-VL vision tower with `vision_config`."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image_processor = Qwen2VLImageProcessorPil(
        patch_size=vision_config.patch_size, temporal_patch_size=vision_config.temporal_patch_size,
        merge_size=vision_config.spatial_merge_size, min_pixels=QWEN25_VL_MIN_PIXELS, max_pixels=QWEN25_VL_MAX_PIXELS,
        image_mean=list(CLIP_MEAN), image_std=list(CLIP_STD), resample=BICUBIC, do_rescale=True,
        rescale_factor=1 / 255, do_normalize=True, do_resize=True, do_convert_rgb=True,
    )
    return _processor_class()(image_processor=image_processor, tokenizer=tokenizer)
