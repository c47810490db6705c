"""The Layered family's preview hooks: the pinned `QwenImageLayeredPipeline` itself decomposes a composite.

The pipeline is called as it is (its own sizing to about 640² or 1024² px, schedule, condition latents,
`additional_t_cond`, decoding of the layers), around the transformer being trained and the VAE, with cached
prompt embeddings: Layered's prompts do not see the image, so a composite given on the canvas needs no text
encoder. Two things are chosen for it, since the pipeline has no width/height:
- `resolution`: 640 or 1024 (the only two it takes), whichever is nearer the preview size asked for;
- the number of layers: the preview sample's (the first training sample), or LAYERS_DEFAULT for a canvas image.
The pipeline captions an empty `prompt` with the VL model even when embeddings are given, so it gets a
placeholder text (it only counts prompts from it); the embeddings are what it samples with.

The preview image is one sheet: the composite, then each layer over a checkerboard (transparency visible).
"""

from __future__ import annotations

import math

from PIL import Image

from ..sampling import prompt_embedding
from .cache import layer_count
from .data import open_rgba
from .pipeline import layered_pipeline

RESOLUTIONS = (640, 1024)  # what the pipeline's `resolution` takes
LAYERS_DEFAULT = 4  # the pipeline's own default
PLACEHOLDER_PROMPT = "(prompt embeddings given)"
CHECKER = 16  # px per square of the sheet's checkerboard


def preview_inputs(components, dataset, prompts: list[str], condition_images):
    """((composite RGBA image, layers), {prompt: (L, D) embedding}) for a preview."""
    embeds = {p: prompt_embedding(dataset, p) for p in dict.fromkeys(prompts)}
    if condition_images:
        preview = dataset.preview_sample
        return (condition_images[0].convert("RGBA"), layer_count(preview) if preview else LAYERS_DEFAULT), embeds
    preview = dataset.preview_sample
    return (open_rgba(preview.image_path), layer_count(preview)), embeds


def preview_pipeline(components):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return layered_pipeline(components, transformer=components.transformer, encoder=False,
                            scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config))


def nearest_resolution(width: int, height: int) -> int:
    side = math.sqrt(width * height)
    return min(RESOLUTIONS, key=lambda r: abs(r - side))


def layer_images(pipe, conditions, call: dict) -> list[Image.Image]:
    """The pipeline's RGBA layers for the composite in `conditions` with the shared sampler's `call`."""
    composite, layers = conditions
    call = dict(call)
    resolution = nearest_resolution(call.pop("width"), call.pop("height"))
    return pipe(image=composite, prompt=PLACEHOLDER_PROMPT, layers=layers, resolution=resolution, **call).images[0]


def preview_image(pipe, conditions, call: dict) -> Image.Image:
    layers = layer_images(pipe, conditions, call)
    composite = conditions[0].resize(layers[0].size, Image.Resampling.LANCZOS)
    return layer_sheet([composite, *layers])


def checkerboard(size: tuple[int, int]) -> Image.Image:
    w, h = size
    board = Image.new("RGBA", size, (255, 255, 255, 255))
    grey = Image.new("RGBA", (CHECKER, CHECKER), (204, 204, 204, 255))
    for y in range(0, h, CHECKER):
        for x in range((y // CHECKER) % 2 * CHECKER, w, 2 * CHECKER):
            board.paste(grey, (x, y))
    return board


def layer_sheet(images: list[Image.Image]) -> Image.Image:
    """RGBA images of one size side by side, each over a checkerboard: one RGB image."""
    w, h = images[0].size
    sheet = Image.new("RGB", (w * len(images), h), "white")
    for i, image in enumerate(images):
        sheet.paste(Image.alpha_composite(checkerboard((w, h)), image.convert("RGBA")).convert("RGB"), (i * w, 0))
    return sheet
