"""Qwen-Image-Layered (RGBA layer decomposition) as a model family: what differs from text-to-image.

Given a composite image, the model makes it again and its RGBA layers: F = layers + 1 latent frames,
denoised together, with the composite's clean latents as a condition image after them (layer-3D RoPE,
`additional_t_cond`). Its VAE takes and makes RGBA (4 image channels); its prompts are text only.

Modules, one concern each:
    family.py     the family: the hooks the shared engine calls (families/base.py)
    pipeline.py   the pinned `QwenImageLayeredPipeline` as the one source of prompts, frames, packing,
                  `img_shapes`, the timestep conditioning and the schedule's mu (we call its own pieces)
    data.py       the dataset convention: composite + caption + name_layer_N.png, and its errors
    cache.py      its part of the shared cache: (C, F, h, w) targets, text-only prompts
    sampling.py   its preview hooks: the pipeline itself, the layers laid out in one image
    files.py      the loaders (ComfyUI's files, diffusers folders) and how a file says it is Layered
    tiny.py       a tiny Layered model set (random weights) for tests and the demo
    demo.py       the built-in layered dataset
"""
