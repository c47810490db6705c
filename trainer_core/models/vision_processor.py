"""What the Qwen-VL image processor refuses, asked before an image reaches it.

Qwen-Image-Edit's Qwen2.5-VL and Qwen-Image 2.1's Qwen3-VL see control and reference images through transformers'
Qwen2-VL image processor, whose `smart_resize` raises a bare ValueError for an image it cannot take (an aspect ratio
over 200:1). The families ask `processor_refusal` with the size the processor will get, and refuse such an image by
its file name with what to do, before anything is encoded.
"""

from __future__ import annotations


def processor_refusal(width: int, height: int) -> str | None:
    """Why the Qwen-VL image processor refuses a `width` x `height` px image (its own words), or None."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    try:
        smart_resize(height, width)
    except ValueError as e:
        return str(e)
    return None
