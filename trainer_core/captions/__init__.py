"""Captions for a dataset folder, written by the vision-language model inside the text encoder file the user already
has (issue 42): Qwen2.5-VL for Qwen-Image 1.x, Qwen3-VL for 2.1. No download, no second model.

    model.py     the text encoder file read back as its whole vision-language model (the families read it), freed
                 after (`vision_language_model`, a context manager)
    prompts.py   what the model is asked (style, instruction, trigger word, what not to mention) and how its
                 answer becomes a caption
    generate.py  one image's answer: the chat template through the processor, transformers' own `generate`
    folder.py    which images of a folder need a caption, and writing them: atomic, never over a caption unless
                 asked, the old one kept as a backup; a progress callback per image, a stop between images

The settings are core.config's `CaptionConfig` (the Caption Dataset node's widgets, the `caption` command's flags).
This face imports nothing heavy: the modules are imported where they are used.
"""
