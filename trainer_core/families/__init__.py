"""Model families: what differs between Qwen-Image text-to-image, Qwen-Image-Edit and the families to come.

    registry.py         the families by name, each family's package imported on first use (`get_family`)
    base.py             the seam: `ModelFamily` (its hooks) and `CacheConditioning` (its part of caching)
    loading.py          a model set from the Load settings: the registered package that takes the request loads it
    sampling.py         the shared preview sampler, which asks the family
    comfyui_files.py    the model files ComfyUI's templates download, by member
    qwen_image/         Qwen-Image text-to-image (and 2512)
    qwen_image_edit/    Qwen-Image-Edit, Edit-2509, Edit-2511: one family instance per variant
    qwen_image21/       Qwen-Image 2.1 (single-stream, Qwen3-VL, 16x VAE; patch 1: `ModelFamily.patch_size`),
                        text-to-image and, on an edit dataset, reference-image editing
    qwen_image_layered/ Qwen-Image-Layered: a composite and its RGBA layers as latent frames

A model set carries its family (`QwenImageComponents.family`, given when it is built); the shared engine (cache.py,
the trainer, the memory plan, sampling.py, demo.py) asks it. A new family is a package of its own: its family
instances (`FAMILIES`), its loaders and `load`, its data convention where it has one, its part of caching, its
transformer inputs, pipeline, tiny model and demo data; it registers with `registry.register_family`. No family
imports another; what two share (the edit dataset convention, the demo's shapes) lives in data/.

This package's face imports no family and no torch: the CLI's parser and the run file list the names.
"""

from __future__ import annotations

from .registry import (  # noqa: F401
    DEFAULT,
    family_for_dataset,
    family_names,
    get_family,
    register_family,
    unregister_family,
)
