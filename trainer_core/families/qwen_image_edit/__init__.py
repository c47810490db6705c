"""Qwen-Image-Edit (Edit, Edit-2509, Edit-2511) LoRA training: what differs from text-to-image.

An edit model takes, besides the prompt, 1 to 3 control images. Each is VAE-encoded, packed and appended
after the noisy target tokens on the sequence axis (one `img_shapes` entry per image); the loss covers the
target tokens only. The text encoder sees the control images too, through Qwen2.5-VL's vision tower, in
the edit pipelines' prompt template. Edit-2511 runs the control tokens at timestep 0 (`zero_cond_t`).

Modules, one concern each:
    variants.py   the three variants, what each does differently, and how a file or folder tells which
    config.py     the settings edit training adds (control_resolution, the variant choice of the Load Edit node)
    pipelines.py  the pinned diffusers edit pipelines as the one source of templates, image sizing,
                  prompt encoding with images and control latents (we call their own methods)
    data.py       the dataset convention: target + caption + control images, and its errors
    cache.py      control latents and image-conditioned prompt embeddings on disk
    objective.py  control tokens appended to the target's, as the pipelines do
    sampling.py   preview sampling of an edit with the live adapter
    tiny.py       tiny Edit model sets (random weights) for tests and the demo
    demo.py       `python -m trainer_core demo --model edit-2511`

Loading lives beside the text-to-image loaders (models/edit_files.py, models/edit_processor.py). The
text-to-image engine calls into this package at a few marked hooks: trainer.py (control tokens, per-sample
empty caption, batching by control sizes, edit previews), planner/for_run.py (control tokens in the plan),
data.discover (control files are no targets), nodes/data_nodes.py (the Cache node) and the Preview node.
"""
