"""What the vision-language model is asked, and how its answer becomes a caption file's text.

The instruction is the style's own (or the user's), with the trigger word and "what not to mention" folded in; the
caption is the model's answer made one clean paragraph, with the trigger word put where the caption says `{trigger}`,
else in front ("ohwx, a woman reading in a garden"), unless the model already wrote it. Plain text in, plain text
out: no model here, so every rule is testable on its own.
"""

from __future__ import annotations

import re

from ..core.choices import CAPTION_STYLES
from ..core.command_config import control_character
from ..core.config import CaptionConfig

TRIGGER = "{trigger}"

# Each style's instruction. Written for what trains well: the subject and what is visible, no opinions, no preamble
# ("This image shows ..."), the answer alone, so the caption file holds nothing but the caption.
DEFAULT_INSTRUCTIONS = {
    "short": "Write a one-line caption for this image: name the main subject and what it is doing, in plain words. "
             "Answer with the caption only, without a preamble.",
    "detailed": "Describe this image in detail: the main subject and its appearance, what it is doing, the setting "
                "and background, the colours, the light, the composition and the style (photo, painting, render). "
                "Write plain sentences in one paragraph, without lists or headings, and answer with the description "
                "only.",
    "tags": "List tags for this image, separated by commas: the subject, its features, objects, colours, setting, "
            "style and composition. Answer with the tags only, in lower case, without sentences.",
    # An edit dataset's caption is the edit instruction (data/edit_dataset.py): the model sees the control images,
    # then the target, as Qwen-Image-Edit's prompt lists its pictures.
    "edit": "The last picture is the result of editing the picture before it (the pictures before it, when there are "
            "several). Write the editing instruction that turns them into the last picture, as one short imperative "
            "sentence, for example 'turn the sky into a sunset'. Name only what changed. Answer with the instruction "
            "only.",
}
EDIT = "edit"  # the style that shows the model an edit dataset's controls before its target
# Each style's longest caption in tokens (CaptionConfig.max_new_tokens = 0).
DEFAULT_MAX_NEW_TOKENS = {"short": 64, "detailed": 320, "tags": 128, "edit": 64}
assert tuple(DEFAULT_INSTRUCTIONS) == tuple(DEFAULT_MAX_NEW_TOKENS) == CAPTION_STYLES


def instruction_text(settings: CaptionConfig) -> str:
    """The user turn's text: the instruction with the trigger word and what to leave out folded in."""
    text = settings.instruction.strip() or DEFAULT_INSTRUCTIONS[settings.style]
    trigger = settings.trigger.strip()
    if TRIGGER in text:
        # The user's instruction names where the trigger goes: the model is asked to use the word itself.
        text = text.replace(TRIGGER, trigger) if trigger else text.replace(TRIGGER, "the subject")
    avoid = settings.avoid.strip()
    if avoid:
        text += f" Do not mention {avoid.rstrip('.')}."
    return text


def max_new_tokens(settings: CaptionConfig) -> int:
    return settings.max_new_tokens or DEFAULT_MAX_NEW_TOKENS[settings.style]


def finish_caption(answer: str, settings: CaptionConfig) -> str:
    """The caption file's text from the model's answer: one paragraph (tags: one line of comma-separated tags), the
    trigger word in place. Empty when the model said nothing usable (nothing is written then)."""
    text = _one_paragraph(answer)
    if settings.style == "tags":
        text = ", ".join(t for t in (tag.strip(" .") for tag in re.split(r"[,\n]", text)) if t)
    if not text:
        return ""
    trigger = settings.trigger.strip()
    if not trigger:
        return text.replace(TRIGGER, "").strip()
    if TRIGGER in text:
        return text.replace(TRIGGER, trigger)
    if re.search(rf"(?<!\w){re.escape(trigger)}(?!\w)", text):
        return text  # the model wrote it already (the instruction asked it to)
    return f"{trigger}, {text}"


def _one_paragraph(answer: str) -> str:
    """Whitespace runs (line breaks, U+2028 too) made single spaces, other control characters (NUL, ESC: a model
    may write them, no caption should hold them) left out; a quoted answer unquoted."""
    text = " ".join("".join(ch for ch in answer if ch.isspace() or control_character(ch) is None).split())
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text
