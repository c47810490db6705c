"""The Qwen-VL processors our text encoders see images through, built offline, and what their image processor
refuses, asked before an image reaches it.

`image_only_processor`: transformers' Qwen2-VL or Qwen3-VL processor class with a tokenizer, the PIL image processor
sized to the vision tower (patch, temporal patch and merge from its config; the pixel limits and statistics the real
processor's, which each family passes) and no video processor: transformers 5's fast image processor and its video
processor need torchvision, which is not installed beside a CPU torch wheel (DESIGN §9), and the pipelines pass images
only. (Qwen-Image-Edit's Qwen2.5-VL: families/qwen_image_edit/processor.py; Qwen-Image 2.1's Qwen3-VL:
families/qwen_image21/processor.py.)

Qwen-Image-Edit's Qwen2.5-VL and Qwen-Image 2.1's Qwen3-VL see control and reference images through transformers'
Qwen2-VL image processor, whose `smart_resize` raises a bare ValueError for an image it cannot take (an aspect ratio
over 200:1). The families ask `processor_refusal` with the size the processor will get, and refuse such an image by
its file name with what to do, before anything is encoded.
"""

from __future__ import annotations

BICUBIC = 3  # PIL.Image.Resampling.BICUBIC: the Qwen-VL processors' resampling


def image_only_processor(processor_class, tokenizer, vision_config, min_pixels: int, max_pixels: int, mean, std,
                         chat_template: str | None = None):
    """`processor_class` (transformers' Qwen2VLProcessor or Qwen3VLProcessor) around `tokenizer` and a PIL image
    processor for a vision tower with `vision_config`, without its video processor (module docstring)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class ImageOnlyProcessor(processor_class):
        """The processor with an image processor and a tokenizer, no video processor. transformers takes a
        processor's parts from its __init__ signature."""

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    image_processor = Qwen2VLImageProcessorPil(
        patch_size=vision_config.patch_size, temporal_patch_size=vision_config.temporal_patch_size,
        merge_size=vision_config.spatial_merge_size, min_pixels=min_pixels, max_pixels=max_pixels,
        image_mean=list(mean), image_std=list(std), resample=BICUBIC, do_rescale=True, rescale_factor=1 / 255,
        do_normalize=True, do_resize=True, do_convert_rgb=True,
    )
    return ImageOnlyProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template)


def processor_refusal(width: int, height: int) -> str | None:
    """Why the Qwen-VL image processor refuses a `width` x `height` px image (its own words), or None."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    try:
        smart_resize(height, width)
    except ValueError as e:
        return str(e)
    return None
