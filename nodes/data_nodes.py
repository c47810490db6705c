"""Dataset discovery and the latent / prompt cache."""

from __future__ import annotations

from pathlib import Path

from ..trainer_core.core.config import CUSTOM_FOLDER, CacheConfig, DatasetConfig
from ..trainer_core.core.errors import UserInputError
from ..trainer_core.core.files import inside
from ..trainer_core.data.cache import build_cache
from ..trainer_core.data.graph_images import GraphImagesConfig, graph_dataset
from ..trainer_core.data.images import folder_state, load_dataset
from ..trainer_core.data.masks import MASK_FOLDER
from ..trainer_core.data.mixture import cache_inputs, data_settings, mix
from . import host
from .common import CACHED, CATEGORY, DATASET, MODELS, engine_mode
from .widgets import widgets

# Folder values that name the examples shipped with the pack: a path relative to the pack would depend on where
# ComfyUI was started and on the pack's folder name. The stars are the first-run workflow's: 8 pictures of a shape
# the shipped shapes model never saw (trainer_core/devtools/shapes.py writes them); the shapes regularisation set is
# the regularised first-run workflow's second dataset; the stars on a floor carry loss masks.
EXAMPLES = Path(__file__).resolve().parents[1] / "example_dataset"
EXAMPLE_DATASETS = {"(example: stars)": EXAMPLES / "stars", "(example: coloured shapes)": EXAMPLES / "coloured_shapes",
                    "(example: shapes regularization)": EXAMPLES / "shapes_regularization",
                    "(example: stars on a floor, masked)": EXAMPLES / "stars_on_floor"}


class QwenLoRADataset:
    DESCRIPTION = (
        "A folder of training images (png/jpg/webp) with same-name .txt captions, grouped into aspect-ratio "
        "buckets. Transparent images keep their alpha for Qwen-Image 2.1 (transparency), else are composited onto the "
        "background colour; 16-bit grey is scaled. A loss mask "
        "per image (name_mask.png beside it, or masks/name.png: white trains, black weighs mask_background_weight) "
        "is optional. Errors name the file to fix."
    )
    CATEGORY = CATEGORY
    FUNCTION = "discover"
    RETURN_TYPES = (DATASET, "STRING")
    RETURN_NAMES = ("dataset", "summary")
    OUTPUT_TOOLTIPS = ("The images, captions and buckets found.", "How many images landed in which bucket.")

    @classmethod
    def INPUT_TYPES(cls):
        # Newer widgets go last (a saved canvas workflow stores widget values by position) and are optional
        # (an API workflow written before them still validates: no held-out images, the typed folder).
        return {"required": widgets(
            DatasetConfig, "folder", "resolution", "enable_buckets", "min_bucket_side", "max_bucket_side",
            "repeats", "caption_extension", "missing_caption", "upscale_small_images", "background",
            "allow_large_images",
        ), "optional": widgets(DatasetConfig, "validation_images", "input_folder", "mask_background_weight",
                               "loss_weight", "is_regularization", "transparency")}

    @classmethod
    def IS_CHANGED(cls, folder="", input_folder=CUSTOM_FOLDER, **_):
        # Widgets alone do not show that files in the folder changed: fold the folder's state in. A folder wired from
        # another node (Caption Dataset's) is not given here: that node's own state says when the folder changed.
        try:
            found = dataset_folder(folder, input_folder)
            return folder_state(found) + "|" + folder_state(Path(found) / MASK_FOLDER)  # masks/ counts too
        except UserInputError as e:
            return str(e)

    def discover(self, folder, input_folder=CUSTOM_FOLDER, validation_images=0, **settings):
        cfg = DatasetConfig(folder=dataset_folder(folder, input_folder), input_folder=input_folder,
                            validation_images=validation_images, **settings)
        dataset = load_dataset(cfg)
        return (dataset, dataset.summary())


# The folder node's settings that apply to pictures from the graph (no folder, caption files or file decoding).
GRAPH_WIDGETS = ("resolution", "enable_buckets", "min_bucket_side", "max_bucket_side", "repeats",
                 "upscale_small_images", "background", "transparency", "validation_images", "mask_background_weight",
                 "loss_weight", "is_regularization")
GRAPH_IMAGES_FOLDER = "qwen_lora_training/graph_images"  # inside the output folder: one folder per batch


class QwenLoRAImagesToDataset:
    DESCRIPTION = (
        "Images from the graph as a training dataset: an IMAGE batch (Load Image, a crop, a generated batch...), "
        "its captions (one per line in the batch's order, or one line for all) and optionally a MASK batch as loss "
        "masks (1 trains, 0 weighs mask_background_weight). Feeds the Cache node like a folder dataset; the pictures "
        "are written once into ComfyUI's output folder under a name made from their pixels, so an unchanged batch is "
        "not encoded again and a changed picture is."
    )
    CATEGORY = CATEGORY
    FUNCTION = "build"
    RETURN_TYPES = (DATASET, "STRING")
    RETURN_NAMES = ("dataset", "summary")
    OUTPUT_TOOLTIPS = ("The pictures, captions and buckets, for the Cache node.",
                       "How many pictures landed in which bucket.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "images": ("IMAGE", {"tooltip": "The training pictures: an IMAGE batch (batch, height, width, channels; "
                                            "4 channels keep their transparency for Qwen-Image 2.1)."}),
            **widgets(GraphImagesConfig, "captions"),
            **widgets(DatasetConfig, *GRAPH_WIDGETS),
        }, "optional": {
            "mask": ("MASK", {"tooltip": "Loss masks, one per picture or one for all, of the pictures' size: 1 trains, "
                                         "0 weighs mask_background_weight. Load Image's mask is 1 where the picture is "
                                         "transparent: put Invert Mask between to train the opaque part."}),
        }}

    def build(self, images, captions, mask=None, **settings):
        root = inside(host.output_directory(), GRAPH_IMAGES_FOLDER, "the graph images folder", GRAPH_IMAGES_FOLDER)
        dataset = graph_dataset(root, images, captions, mask, **settings)
        return (dataset, dataset.summary())


class QwenLoRADatasetMix:
    DESCRIPTION = (
        "Several datasets in one run, for one Cache node: e.g. the subject's images and a regularisation set at a "
        "lower loss_weight. Each keeps its own Dataset node's settings (resolution, repeats, loss_weight, "
        "is_regularization, masks); an image comes up `repeats` times per epoch whatever its dataset, and the loss "
        "report shows each dataset's mean. The same as a run file's several [[dataset]] tables."
    )
    CATEGORY = CATEGORY
    FUNCTION = "mix"
    RETURN_TYPES = (DATASET, "STRING")
    RETURN_NAMES = ("dataset", "summary")
    OUTPUT_TOOLTIPS = ("The datasets as one, for the Cache node.", "Each dataset's images, buckets and weight.")

    @classmethod
    def INPUT_TYPES(cls):
        tip = "From a Dataset node (Edit Dataset, Layered Dataset, or another Dataset Mix)."
        return {"required": {f"dataset_{i}": (DATASET, {"tooltip": tip}) for i in (1, 2)},
                "optional": {f"dataset_{i}": (DATASET, {"tooltip": tip + " Optional."}) for i in (3, 4)}}

    def mix(self, dataset_1, dataset_2, dataset_3=None, dataset_4=None):
        mixed = mix([d for d in (dataset_1, dataset_2, dataset_3, dataset_4) if d is not None])
        return (mixed, mixed.summary())


def dataset_folder(folder: str, input_folder: str = CUSTOM_FOLDER) -> str:
    """The absolute dataset folder: the chosen subfolder of ComfyUI's input folder, or the typed path (a
    relative one inside the input folder, never against the working directory, which depends on how
    ComfyUI was started)."""
    base = host.input_directory()
    if input_folder != CUSTOM_FOLDER:
        return str(base / input_folder)
    text = folder.strip()
    if text in EXAMPLE_DATASETS:
        return str(EXAMPLE_DATASETS[text])
    if not text:
        raise UserInputError(
            f"no dataset folder chosen: pick a subfolder of ComfyUI's input folder {base} in input_folder, or type "
            "a folder path (a relative one is inside that input folder).")
    path = Path(text).expanduser()
    if path.is_absolute():
        return str(path)
    resolved = base / path
    # Earlier example workflows wrote 'input/<name>' (meant relative to ComfyUI's folder): accept that too.
    if not resolved.is_dir() and path.parts[0] == "input" and (base / Path(*path.parts[1:])).is_dir():
        resolved = base / Path(*path.parts[1:])
    return str(resolved)


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
            "dataset": (DATASET, {"tooltip": "From a Dataset node (or a Dataset Mix of several)."}),
            **widgets(CacheConfig, "preview_prompts", "negative_prompt", "caching_batch_size", "cache_folder"),
        },
            # Newer widgets go last and are optional (as the Dataset node's).
            "optional": widgets(CacheConfig, "preservation_trigger", "preservation_class"),
        }

    def cache(self, models, dataset, preview_prompts, negative_prompt, caching_batch_size, cache_folder,
              preservation_trigger="", preservation_class=""):
        cfg = CacheConfig(preview_prompts=preview_prompts, negative_prompt=negative_prompt,  # checked as it is made
                          caching_batch_size=caching_batch_size, cache_folder=cache_folder,
                          preservation_trigger=preservation_trigger, preservation_class=preservation_class)
        # Nothing is written outside ComfyUI's output folder: the cache folder is a name inside it.
        folder = inside(host.output_directory(), cache_folder.strip() or "qwen_lora_training/cache", "cache_folder",
                        "qwen_lora_training/cache")
        prompts = [line.strip() for line in preview_prompts.splitlines() if line.strip()]
        samples, validation, repeats = cache_inputs(dataset)  # a Dataset Mix's: its datasets', labelled
        progress = host.Progress(len(samples) + len(validation) + len(prompts) + 1)
        with engine_mode():  # the model set's family keys and encodes the prompts and conditions (Edit: controls)
            cached = build_cache(models, samples, folder, preview_prompts=prompts,
                                 negative_prompt=negative_prompt, batch_size=caching_batch_size,
                                 repeats=repeats, validation=validation,
                                 progress=lambda done, todo: progress.update(done, total=todo),
                                 settings=data_settings(models.family, dataset),
                                 preservation=(cfg.preservation_trigger, cfg.preservation_class)
                                 if cfg.preservation_trigger.strip() else None)
        return (cached, cached.report.summary())
