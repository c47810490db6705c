"""A model family defined entirely in the test tree (tests/house/test_new_family.py): what a new Qwen-Image member takes.

"toy-captions" trains a Qwen-Image-architecture transformer of its own tiny size (3 blocks) on a dataset convention of
its own: images in a folder whose captions are one `captions.json` ({file name: caption}) instead of a .txt beside
each. Its package says what every family package says (families/registry.py):

    FAMILIES   {"toy-captions": TOY}
    load       a Load request it recognises: the tiny test model when a run asks for it by its config (never here)

The engine knows it only through the registry and its hooks: this package touches no file of the pack.
"""

from __future__ import annotations

from .family import FAMILIES, TOY  # noqa: F401


def load(request):
    """No file of ComfyUI's is this family's: every Load request is another package's."""
    return None
