"""Dataset discovery and the latent / prompt cache."""

from __future__ import annotations

from pathlib import Path

from ..trainer_core.cache import build_cache
from ..trainer_core.config import CacheConfig, DatasetConfig
from ..trainer_core.data import folder_state, load_dataset
from ..trainer_core.files import inside
from . import host
from .common import CACHED, CATEGORY, DATASET, MODELS, engine_mode
from .widgets import widgets

# The folder value that names the 8-image example shipped with the pack (the tiny first-run workflow's):
# a path relative to the pack would depend on where ComfyUI was started and on the pack's folder name.
EXAMPLE_DATASET = "(example: coloured shapes)"
EXAMPLE_FOLDER = Path(__file__).resolve().parents[1] / "example_dataset" / "coloured_shapes"


def dataset_folder(folder: str) -> str:
    """The folder to read: the shipped example for EXAMPLE_DATASET, else the value as given."""
    return str(EXAMPLE_FOLDER) if folder.strip() == EXAMPLE_DATASET else folder


class QwenLoRADataset:
    DESCRIPTION = (
        "A folder of training images (png/jpg/webp) with same-name .txt captions, grouped into aspect-ratio "
        "buckets. Transparent pixels are composited onto the background colour; 16-bit grey is scaled. Errors "
        "name the file to fix."
    )
    CATEGORY = CATEGORY
    FUNCTION = "discover"
    RETURN_TYPES = (DATASET, "STRING")
    RETURN_NAMES = ("dataset", "summary")
    OUTPUT_TOOLTIPS = ("The images, captions and buckets found.", "How many images landed in which bucket.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": widgets(
            DatasetConfig, "folder", "resolution", "enable_buckets", "min_bucket_side", "max_bucket_side",
            "repeats", "caption_extension", "missing_caption", "upscale_small_images", "background",
            "allow_large_images",
        )}

    @classmethod
    def IS_CHANGED(cls, folder, **_):
        # Widgets alone do not show that files in the folder changed: fold the folder's state in.
        return folder_state(dataset_folder(folder))

    def discover(self, **settings):
        settings["folder"] = dataset_folder(settings["folder"])
        dataset = load_dataset(DatasetConfig(**settings))
        return (dataset, dataset.summary())


class QwenLoRACache:
    DESCRIPTION = (
        "Encodes every image with the VAE and every caption (plus the preview and negative prompts) with the "
        "text encoder once, into a cache on disk keyed by content, then frees the text encoder. Re-running "
        "over unchanged data encodes nothing."
    )
    CATEGORY = CATEGORY
    FUNCTION = "cache"
    RETURN_TYPES = (CACHED, "STRING")
    RETURN_NAMES = ("cached_dataset", "report")
    OUTPUT_TOOLTIPS = ("The dataset as cached latents and embeddings.", "What was encoded and what was reused.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "models": (MODELS, {"tooltip": "From Load Qwen-Image (training)."}),
            "dataset": (DATASET, {"tooltip": "From the Dataset node."}),
            **widgets(CacheConfig, "preview_prompts", "negative_prompt", "caching_batch_size", "cache_folder"),
        }}

    def cache(self, models, dataset, preview_prompts, negative_prompt, caching_batch_size, cache_folder):
        # Nothing is written outside ComfyUI's output folder: the cache folder is a name inside it.
        folder = inside(host.output_directory(), cache_folder.strip() or "qwen_lora_training/cache", "cache_folder",
                        "qwen_lora_training/cache")
        prompts = [line.strip() for line in preview_prompts.splitlines() if line.strip()]
        progress = host.Progress(len(dataset.samples) + len(prompts) + 1)
        with engine_mode():
            cached = build_cache(models, list(dataset.samples), folder, preview_prompts=prompts, negative_prompt=negative_prompt,
                                 batch_size=caching_batch_size, repeats=dataset.config.repeats,
                                 progress=lambda done, todo: progress.update(done, total=todo))
        return (cached, cached.report.summary())
