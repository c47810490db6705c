"""Model families: what differs between Qwen-Image text-to-image, Qwen-Image-Edit and the families to come.

    base.py             the seam: `ModelFamily` (its hooks) and `CacheConditioning` (its part of caching)
    qwen_image.py       Qwen-Image text-to-image, and its loaders: models/'s (which know no family), family handed
    qwen_image_edit/    Qwen-Image-Edit, Edit-2509, Edit-2511: one family instance per variant
    qwen_image21/       Qwen-Image 2.1 (single-stream, Qwen3-VL, 16x VAE; patch 1: `ModelFamily.patch_size`),
                        text-to-image and, on an edit dataset, reference-image editing
    qwen_image_layered/ Qwen-Image-Layered: a composite and its RGBA layers as latent frames

A model set carries its family (`QwenImageComponents.family`); the shared engine (cache.py, the trainer,
the memory plan, sampling.py, demo.py) asks it. A new family (Qwen-Image 2.1, Layered) is a new instance:
a module or package here with its loaders (which set `components.family`), data convention, its part of
caching, its transformer inputs, pipeline, tiny model and demo data, registered in FAMILIES.

Lifted into hooks for Layered and 2.1: the packing of latents into tokens and the token grid (`patch_size`,
`pack`, `token_grid`), the resolution shift's mu (`resolution_mu`), the encoding and key of targets
(`CacheConditioning.target_key`, `encode_target`), the transformer's keyword arguments (`transformer_kwargs`,
`extra_transformer_kwargs`), the output tokens the loss covers (`target_prediction`) and the preview pipeline's
call (`preview_image`). Still Qwen-Image's in the shared path: the memory plan's architecture and activation
terms (planner/), and the LoRA file layouts (lora_files.py; 2.1's fused MLP: adapters/fused_mlp_lora.py).
"""

from __future__ import annotations

from ..core.errors import UserInputError
from .base import ModelFamily
from .qwen_image import QWEN_IMAGE
from .qwen_image21.family import QWEN_IMAGE21
from .qwen_image_edit.family import EDIT_FAMILIES
from .qwen_image_layered.family import QWEN_IMAGE_LAYERED

FAMILIES: dict[str, ModelFamily] = {QWEN_IMAGE.name: QWEN_IMAGE, **EDIT_FAMILIES, QWEN_IMAGE21.name: QWEN_IMAGE21,
                                    QWEN_IMAGE_LAYERED.name: QWEN_IMAGE_LAYERED}


def get_family(name: str) -> ModelFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        raise UserInputError(f"model family {name!r} is not one of {list(FAMILIES)}.") from None
