"""The Qwen3-VL processor Qwen-Image 2.1's pipeline encodes prompts (and condition images) through, built offline.

A diffusers folder of Qwen-Image 2.1 carries `processor/` (read with `Qwen3VLProcessor.from_pretrained`);
the tiny model and files without one get this one: a tokenizer, transformers' PIL image processor sized
to the vision tower (patch, merge and temporal patch from its config) and a chat template that writes
the Qwen chat format (`<|im_start|>role\\n...<|im_end|>\\n`, an image as
`<|vision_start|><|image_pad|><|vision_end|>`), which is all the pipeline asks of it: it formats the
prompt itself and only counts the tokens of the system message with `apply_chat_template`.

It is built as models/vision_processor.py builds a Qwen-VL processor offline (no video processor).
"""

from __future__ import annotations

from transformers import Qwen3VLProcessor

from ...models.vision_processor import image_only_processor

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


def build_processor(tokenizer, vision_config):
    """The processor for `tokenizer` and a Qwen3-VL vision tower with `vision_config`."""
    return image_only_processor(Qwen3VLProcessor, tokenizer, vision_config, MIN_PIXELS, MAX_PIXELS, QWEN3_VL_MEAN,
                                QWEN3_VL_STD, chat_template=CHAT_TEMPLATE)
