"""The Qwen3-VL processor Qwen-Image 2.1's pipeline encodes prompts (and condition images) through, built offline.

A diffusers folder of Qwen-Image 2.1 carries `processor/` (read with `Qwen3VLProcessor.from_pretrained`);
the tiny model and files without one get this one: a tokenizer, transformers' PIL image processor sized
to the vision tower (patch, merge and temporal patch from its config) and a chat template that writes
the Qwen chat format (`<|im_start|>role\\n...<|im_end|>\\n`, an image as
`<|vision_start|><|image_pad|><|vision_end|>`), which is all the pipeline asks of it: it formats the
prompt itself and only counts the tokens of the system message with `apply_chat_template`.

No video processor: transformers 5's video processor needs torchvision, which is not installed beside a
CPU torch wheel (DESIGN §9), and the pipeline passes images only.
"""

from __future__ import annotations

# Qwen's chat format, as a Jinja template (the expressions write the newlines, so whitespace control
# cannot eat them).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- elif part['type'] == 'image' -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# Qwen3-VL's image statistics and pixel limits (its preprocessor_config.json: mean/std 0.5, 16 px patches).
QWEN3_VL_MEAN = (0.5, 0.5, 0.5)
QWEN3_VL_STD = (0.5, 0.5, 0.5)
MIN_PIXELS = 65536
MAX_PIXELS = 16777216


def _processor_class():
    from transformers import Qwen3VLProcessor

    class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
        """Qwen3VLProcessor with an image processor and a tokenizer, no video processor (module docstring)."""

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return ImageOnlyQwen3VLProcessor


def build_processor(tokenizer, vision_config):
    """The processor for `tokenizer` and a Qwen3-VL vision tower with `vision_config`."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image_processor = Qwen2VLImageProcessorPil(
        patch_size=vision_config.patch_size, temporal_patch_size=vision_config.temporal_patch_size,
        merge_size=vision_config.spatial_merge_size, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS,
        image_mean=list(QWEN3_VL_MEAN), image_std=list(QWEN3_VL_STD), resample=3, do_rescale=True,
        rescale_factor=1 / 255, do_normalize=True, do_resize=True, do_convert_rgb=True,
    )
    return _processor_class()(image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
