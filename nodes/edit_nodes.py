"""Editing: loading a model set that edits (a Qwen-Image-Edit variant, or Qwen-Image 2.1 with its reference images),
finding an edit dataset (data/edit_dataset.py) and previewing an edit; the engine decides which family loads.

The other nodes (Cache, Init Trainer, Train Steps, Loss Plot, Save, ...) take edit model sets and datasets as
they are: Cache encodes controls and image-conditioned prompts for them. Previews have a node each, so the
text-to-image Preview shows no control image sockets.
"""

from __future__ import annotations

from ..trainer_core.core.config import CUSTOM_FOLDER, DatasetConfig, EditDataConfig, EditLoadConfig
from ..trainer_core.core.errors import UserInputError
from ..trainer_core.data.edit_dataset import MAX_CONTROLS, load_edit_dataset
from ..trainer_core.families.loading import load_model_set
from .common import CATEGORY, DATASET, MODELS, engine_mode
from .data_nodes import QwenLoRADataset, dataset_folder
from .model_nodes import load_request
from .output_nodes import EDIT_PREVIEW, PREVIEW, QwenLoRAPreview, preview_image, takes_control_images
from .widgets import widgets


class QwenLoRALoadEditModels:
    DESCRIPTION = (
        "Loads Qwen-Image-Edit (Edit, Edit-2509 or Edit-2511) for LoRA training from ComfyUI's files (the text "
        "encoder with its vision tower) or a diffusers folder; the variant is read from the file unless chosen. "
        "A Qwen-Image 2.1 transformer or folder loads as by the Load node (it edits with an Edit Dataset). The "
        "output feeds the Cache and Init Trainer nodes, with an Edit Dataset."
    )
    CATEGORY = CATEGORY
    FUNCTION = "load"
    RETURN_TYPES = (MODELS,)
    RETURN_NAMES = ("models",)
    OUTPUT_TOOLTIPS = ("Qwen-Image-Edit parts for training (not a ComfyUI MODEL).",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": widgets(EditLoadConfig)}

    def load(self, source, transformer, text_encoder, vae, diffusers_folder, storage, compute_dtype,
             text_encoder_fp8, edit_variant):
        with engine_mode():
            return (load_model_set(load_request(source, transformer, text_encoder, vae, diffusers_folder, storage,
                                                compute_dtype, text_encoder_fp8, edit=True,
                                                edit_variant=edit_variant)),)


class QwenLoRAEditDataset:
    DESCRIPTION = (
        "An edit dataset: per sample a target image, its .txt caption (the edit instruction) and 1 to 3 control "
        "images (Qwen-Image 2.1: up to 10): name_control.png, name_control_2.png, name_control_3.png, ... beside it, "
        "or control/name.png, control/name_2.png, ... Buckets come from the target; controls keep their aspect ratio "
        "and are sized by the edit model's rule. Qwen-Image 2.1 (from either Load node) trains reference-image "
        "editing on it: the controls are its reference images. Errors name the file to fix."
    )
    CATEGORY = CATEGORY
    FUNCTION = "discover"
    RETURN_TYPES = (DATASET, "STRING")
    RETURN_NAMES = ("dataset", "summary")
    OUTPUT_TOOLTIPS = ("The targets, captions, controls and buckets found.", "What was found.")

    @classmethod
    def INPUT_TYPES(cls):
        spec = QwenLoRADataset.INPUT_TYPES()
        return {"required": {**spec["required"], **widgets(EditDataConfig)}, "optional": spec["optional"]}

    IS_CHANGED = QwenLoRADataset.IS_CHANGED  # the folder's state (a control file counts too)

    def discover(self, folder, control_resolution, input_folder=CUSTOM_FOLDER, validation_images=0, **settings):
        cfg = DatasetConfig(folder=dataset_folder(folder, input_folder), input_folder=input_folder,
                            validation_images=validation_images, **settings)
        dataset = load_edit_dataset(cfg, EditDataConfig(control_resolution=control_resolution))
        return (dataset, dataset.summary())


class QwenLoRAEditPreview:
    DESCRIPTION = (
        "Qwen-Image-Edit, or Qwen-Image 2.1 trained on an Edit Dataset (its reference images): edits control images "
        "with the LoRA as it is now (fixed seed, so previews compare across steps): the images wired in, else the "
        "first training sample's controls. The prompt must be one of the "
        "Cache node's preview prompts; empty uses the first."
    )
    CATEGORY = CATEGORY
    FUNCTION = "preview"
    RETURN_TYPES = QwenLoRAPreview.RETURN_TYPES
    RETURN_NAMES = QwenLoRAPreview.RETURN_NAMES
    OUTPUT_TOOLTIPS = ("The edited image.", QwenLoRAPreview.OUTPUT_TOOLTIPS[1])

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": QwenLoRAPreview.INPUT_TYPES()["required"], "optional": {
            f"control_image_{i}": ("IMAGE", {"tooltip": f"Control image {i} (Picture {i}) to edit, e.g. from a Load "
                                            "Image. Unconnected: the first training sample's controls. A prompt with "
                                            "canvas images is encoded now (the text encoder is loaded for it). "
                                            "Edit-2509/2511 take 3, Edit 1, Qwen-Image 2.1 up to 10."})
            for i in range(1, MAX_CONTROLS + 1)
        }}

    def preview(self, trainer, prompt, width, height, steps, cfg, preview_seed, weights="raw", **control_images):
        trainer.require_live()
        if not takes_control_images(trainer):
            raise UserInputError(f"{EDIT_PREVIEW} edits control images, but this trainer trains "
                                 f"{trainer.components.family.name}, a text-to-image model: use {PREVIEW} "
                                 "(QwenLoRAPreview) instead (Qwen-Image 2.1 edits when it trains on an Edit "
                                 "Dataset).")
        controls = [control_images[f"control_image_{i}"] for i in range(1, MAX_CONTROLS + 1)
                    if control_images.get(f"control_image_{i}") is not None]
        return preview_image(trainer, prompt, width, height, steps, cfg, preview_seed, controls, weights)
