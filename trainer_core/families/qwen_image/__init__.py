"""Qwen-Image text-to-image (and Qwen-Image-2512): the family (family.py) and its loaders (loading.py).

    FAMILIES   {"qwen-image": QWEN_IMAGE}
    load       the Load node's request, when no other family's package recognised its files (families/loading.py)
"""

from __future__ import annotations

from .family import QWEN_IMAGE, PromptsOnly, QwenImage, text_key  # noqa: F401
from .loading import build_tiny_components, load, load_diffusers_dir, load_shapes_model, load_single_files, misplaced  # noqa: F401

FAMILIES = {QWEN_IMAGE.name: QWEN_IMAGE}
