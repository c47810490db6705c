"""The three Qwen-Image-Edit variants and what tells them apart.

| variant    | diffusers pipeline          | control images | control tokens' timestep            |
|------------|-----------------------------|----------------|-------------------------------------|
| edit       | QwenImageEditPipeline       | 1              | the target's                        |
| edit-2509  | QwenImageEditPlusPipeline   | 1 to 3         | the target's                        |
| edit-2511  | QwenImageEditPlusPipeline   | 1 to 3         | 0 (transformer config `zero_cond_t`) |

Edit and Edit-2509 transformers have the same tensors; only the way they were trained differs. So a file
tells 2511 by ComfyUI's marker key (`__index_timestep_zero__`, comfy/model_detection.py of ComfyUI 0.33.0,
which then samples with ref method "index_timestep_zero"; ComfyUI 0.3.64 has no 2511 support), a diffusers
folder by `zero_cond_t` in its transformer config, and Edit from 2509 by the pipeline class of the folder's
model_index.json or by "2509" in the file name. When that is not enough, the user chooses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import UserInputError
from ...models.layouts import EDIT_2511_MARKER as ZERO_COND_MARKER  # a registered empty buffer, saved with the weights


@dataclass(frozen=True)
class EditVariant:
    name: str
    pipeline: str  # diffusers class name; pipelines.py builds it
    max_controls: int
    zero_cond_t: bool  # the transformer runs control tokens at timestep 0

    @property
    def multi_image(self) -> bool:
        """Edit-Plus prompts ("Picture N: ..." per image; encoder images ~384² px, VAE images ~1024² px)."""
        return self.pipeline == "QwenImageEditPlusPipeline"


EDIT_VARIANTS: dict[str, EditVariant] = {
    "edit": EditVariant("edit", "QwenImageEditPipeline", max_controls=1, zero_cond_t=False),
    "edit-2509": EditVariant("edit-2509", "QwenImageEditPlusPipeline", max_controls=3, zero_cond_t=False),
    "edit-2511": EditVariant("edit-2511", "QwenImageEditPlusPipeline", max_controls=3, zero_cond_t=True),
}
AUTO = "auto"
VARIANT_CHOICES = (AUTO, *EDIT_VARIANTS)


# Qwen-Image 2.1 edits with up to ten reference images (families/qwen_image21/sampling.py's MAX_REFERENCES; the edit
# datasets read ten): the member to point to when no Edit variant takes a sample's controls.
QWEN_IMAGE21_REFERENCES = 10


def more_controls(count: int) -> str:
    """Where to train a sample of `count` control images that the chosen variant cannot take: the Edit variants that
    take that many, else Qwen-Image 2.1 (never the variant itself: 2511 is told to train 2.1, not 2511)."""
    takes = [v.name.replace("edit", "Edit", 1) for v in EDIT_VARIANTS.values() if v.max_controls >= count]
    if takes:
        return f"train {' or '.join(takes)} (up to {max(v.max_controls for v in EDIT_VARIANTS.values())})"
    if count <= QWEN_IMAGE21_REFERENCES:
        return (f"train Qwen-Image 2.1, which edits with up to {QWEN_IMAGE21_REFERENCES} reference images (its "
                "transformer file qwen_image_2.1_int8_convrot.safetensors in the Load Qwen-Image-Edit node, or a run "
                "file's [model])")
    return f"keep at most {QWEN_IMAGE21_REFERENCES} (Qwen-Image 2.1, the model that takes the most, takes that many)"


def get_variant(name: str) -> EditVariant:
    try:
        return EDIT_VARIANTS[name]
    except KeyError:
        raise UserInputError(f"edit variant {name!r} is not one of {list(EDIT_VARIANTS)}.") from None


def variant_from_file(path: str | Path, keys) -> str:
    """The variant a transformer file holds: 2511 by its marker key, 2509 by its name, else Edit."""
    if any(k == ZERO_COND_MARKER or k.endswith("." + ZERO_COND_MARKER) for k in keys):
        return "edit-2511"
    return "edit-2509" if "2509" in Path(path).name else "edit"


def variant_from_diffusers_dir(root: str | Path) -> str:
    """The variant of a diffusers folder: `zero_cond_t` in transformer/config.json, else model_index.json's
    pipeline class."""
    root = Path(root)
    try:
        config = json.loads((root / "transformer" / "config.json").read_text())
        index = json.loads((root / "model_index.json").read_text()) if (root / "model_index.json").is_file() else {}
    except (OSError, ValueError) as e:
        raise UserInputError(f"model folder {root}: its transformer/config.json or model_index.json cannot be read "
                             f"({e}).") from None
    if config.get("zero_cond_t"):
        return "edit-2511"
    return "edit-2509" if index.get("_class_name") == "QwenImageEditPlusPipeline" else "edit"


def resolve_variant(chosen: str, detected: str) -> EditVariant:
    """The user's choice wins over what the file says, except that a 2511 file is never trained as another
    variant (its control tokens must run at timestep 0) nor another file as 2511."""
    if chosen == AUTO:
        return get_variant(detected)
    variant = get_variant(chosen)
    if variant.zero_cond_t != get_variant(detected).zero_cond_t:
        raise UserInputError(
            f"edit variant {chosen!r} was chosen, but the transformer is {detected!r} "
            f"({'it has' if detected == 'edit-2511' else 'it lacks'} the Edit-2511 marker {ZERO_COND_MARKER}). "
            "Choose 'auto' or the transformer file of the variant you want.")
    return variant
