"""Qwen-Image 2.1 as a model family (diffusers 0.42.1 `QwenImage21Transformer2DModel`, `AutoencoderKLQwenImage21`,
`QwenImage21Pipeline`; transformers' Qwen3-VL): an instance of the seam, not a fork of Qwen-Image's code.

It differs from Qwen-Image in almost every part: single-stream blocks with one shared modulation and a SwiGLU
MLP (arch.py), 64 latent channels taken one cell per token (patch 1), a 16x RGBA VAE, a
Qwen3-VL text encoder whose last hidden states before the final norm are the prompt embedding, and a
transformer whose output covers the joint text + image sequence. It trains text-to-image, and reference-image
editing when its dataset is an edit dataset (data/edit_dataset.py's convention; the controls are its references).

Modules, one concern each:
    arch.py       the architecture's facts, declared for the lower layers (models/architecture.py)
    family.py     the family's hooks (families/base.py)
    objective.py  the transformer's inputs as the pinned pipeline builds them (with references or without)
    text.py       prompt encoding by the pipeline's own method
    references.py reference images by the pipeline's pieces: sizing, prompt with vision tokens, latents
    conditioning.py its part of the shared cache: prompts alone or with references, reference latents
    sampling.py   previews: the pipeline, around a transformer that puts the references in when there are some
    processor.py  the Qwen3-VL processor built offline (tiny model, files without one)
    files.py      ComfyUI's single transformer file (MLP fused or split; bf16, float8): reader and writer
    text_file.py  ComfyUI's single Qwen3-VL-8B text encoder file: reader and writer
    folder.py     a diffusers folder (optionally with the transformer from files.py): loader and writer
    tiny.py       the tiny model set (random weights) for tests and the demo
    recognise.py  whether a Load request names 2.1 (its transformer file, its folder), and its model set from it
    captioning.py its Qwen3-VL text encoder file as the vision-language model that writes captions

    FAMILIES   {"qwen-image-2.1": QWEN_IMAGE21}
    load       a Load (or Load Edit) request that names a 2.1 file or folder (families/loading.py)
    missing_with_file   what a run file naming only a 2.1 transformer file must add (the folder; families/loading.py)
    vision_language_model   a Qwen3-VL text encoder file as a captioner (trainer_core/captions)
"""

from __future__ import annotations

from . import arch  # noqa: F401 (declares the architecture before any model of it exists)
from .family import FAMILIES  # noqa: F401
from .recognise import load, missing_with_file  # noqa: F401
from .captioning import vision_language_model  # noqa: F401
