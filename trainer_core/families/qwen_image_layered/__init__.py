"""Qwen-Image-Layered (RGBA layer decomposition): the family (family.py), its dataset convention (data.py), its part
of caching (cache.py), the pinned pipeline's conventions (pipeline.py), previews (sampling.py), loaders (files.py),
tiny model (tiny.py) and demo data (demo.py).

    FAMILIES   {"qwen-image-layered": QWEN_IMAGE_LAYERED}
    load       the Load node's request when it names a Layered transformer (families/loading.py)
"""

from __future__ import annotations

from .family import FAMILIES  # noqa: F401
from .files import load, misplaced  # noqa: F401
