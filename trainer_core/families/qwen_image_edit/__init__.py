"""Qwen-Image-Edit (Edit, Edit-2509, Edit-2511) as a model family: what differs from text-to-image.

An edit model takes, besides the prompt, 1 to 3 control images. Each is VAE-encoded, packed and appended
after the noisy target tokens on the sequence axis (one `img_shapes` entry per image); the loss covers the
target tokens only. The text encoder sees the control images too, through Qwen2.5-VL's vision tower, in
the edit pipelines' prompt template. Edit-2511 runs the control tokens at timestep 0 (`zero_cond_t`).

Modules, one concern each:
    family.py     the family (one instance per variant): the hooks the shared engine calls (families/base.py)
    variants.py   the three variants, what each does differently, and how a file or folder tells which
    files.py      the loaders (ComfyUI's single files, diffusers folders); processor.py: the Qwen2.5-VL
                  processor the edit prompts are encoded through, built offline
    pipelines.py  the pinned diffusers edit pipelines as the one source of templates, image sizing,
                  prompt encoding with images and control latents (we call their own methods)
    cache.py      its part of the shared cache (cache.build_cache): control latents, image-conditioned prompts
    objective.py  control tokens appended to the target's, as the pipelines do; their term in the memory plan
    sampling.py   its preview hooks: the shared sampler's transformer with the controls appended
    tiny.py       tiny Edit model sets (random weights) for tests and the demo
    demo.py       the built-in edit dataset (`python -m trainer_core demo --model edit-2511`)
    captioning.py Qwen-Image 1.x's Qwen2.5-VL file (shared by the 1.x families) as the model that writes captions

The dataset convention (target + caption + control images) is data/edit_dataset.py's, shared with Qwen-Image 2.1;
the settings edit training adds (control_resolution, the Load Edit node's variant) are core.config's. The shared
engine calls this package only through the family's hooks and `load` (families/loading.py).
"""

from __future__ import annotations

from .family import FAMILIES  # noqa: F401
from .files import load, misplaced  # noqa: F401
from .captioning import vision_language_model  # noqa: F401
