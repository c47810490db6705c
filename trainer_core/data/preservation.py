"""Differential output preservation's captions (ai-toolkit's DOP): which samples take part and their class captions.

A training sample whose caption contains the trigger (e.g. "sks person") takes part; its class caption is the
caption with every occurrence of the trigger replaced by the class word ("person"), matched as written (case and
spaces count). The class captions are encoded while caching, beside the captions, so training never needs the text
encoder; like a caption, as the sample's conditions see it (Edit: with the sample's control images). Samples of a
regularisation dataset never take part: their captions describe the class already.
"""

from __future__ import annotations

from ..core.errors import UserInputError


def class_caption(caption: str, trigger: str, class_word: str) -> str | None:
    """The caption with the trigger replaced by the class word; None when the caption lacks the trigger."""
    trigger, class_word = trigger.strip(), class_word.strip()
    if not trigger or trigger not in caption:
        return None
    return caption.replace(trigger, class_word)


def class_captions(samples, trigger: str, class_word: str) -> list[str | None]:
    """Per sample its class caption (None: it does not take part). Refuses a trigger no caption has: preservation
    would silently do nothing."""
    captions = [None if s.regularization else class_caption(s.caption, trigger, class_word) for s in samples]
    if trigger.strip() and samples and all(c is None for c in captions):
        folders = sorted({s.dataset or "the dataset" for s in samples if not s.regularization}) or ["(none)"]
        raise UserInputError(
            f"preservation_trigger={trigger!r} appears in no caption of the training dataset(s) "
            f"{', '.join(folders)} (regularisation sets are not searched): write it into the captions of the "
            "subject's images exactly as typed (case and spaces count), or clear preservation_trigger.")
    return captions
