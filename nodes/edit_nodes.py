"""Qwen-Image-Edit: loading an Edit model set, finding an edit dataset and previewing an edit (the engine:
trainer_core/families/qwen_image_edit/).

The other nodes (Cache, Init Trainer, Train Steps, Loss Plot, Save, ...) take edit model sets and datasets as
they are: Cache encodes controls and image-conditioned prompts for them. Previews have a node each, so the
text-to-image Preview shows no control image sockets.
"""

from __future__ import annotations

from ..trainer_core.core.config import CUSTOM_FOLDER, NOT_USED, DatasetConfig
from ..trainer_core.core.errors import UserInputError
from ..trainer_core.families.qwen_image21.recognise import is_qwen_image21_file, is_qwen_image21_folder
from ..trainer_core.families.qwen_image_edit.config import EditDataConfig, EditLoadConfig
from ..trainer_core.families.qwen_image_edit.data import load_edit_dataset
from ..trainer_core.families.qwen_image_edit.files import (TINY_AUTO_VARIANT, load_edit_diffusers_dir,
                                                           load_edit_single_files)
from ..trainer_core.families.qwen_image_edit.tiny import build_tiny_edit_components
from ..trainer_core.families.qwen_image_edit.variants import AUTO
from ..trainer_core.families.recognise import load_recognised
from ..trainer_core.models.source import DIFFUSERS, FILES, TINY, resolve_compute_dtype
from ..trainer_core.models.tokenizer import tokenizer_candidates
from . import host
from .common import CATEGORY, DATASET, MODELS, engine_mode
from .data_nodes import QwenLoRADataset, dataset_folder
from .output_nodes import EDIT_PREVIEW, PREVIEW, QwenLoRAPreview, preview_image, takes_control_images
from .widgets import widgets


def qwen_image21_settings(source, transformer, text_encoder, diffusers_folder) -> dict | None:
    """The 2.1 loader's file settings when the Load Edit settings name a 2.1 transformer file or folder, else None."""
    if source == FILES:
        first = host.model_file_path("diffusion_models", transformer) if transformer != NOT_USED else None
        if first is not None and is_qwen_image21_file(first):
            encoder = None if text_encoder == NOT_USED else host.model_file_path("text_encoders", text_encoder)
            return dict(transformer=first, text_encoder=encoder)
    elif source == DIFFUSERS and is_qwen_image21_folder(diffusers_folder):
        return {}
    return None


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
        device = host.compute_device()
        dtype = resolve_compute_dtype(compute_dtype, device)
        with engine_mode():
            if source == TINY:
                variant = TINY_AUTO_VARIANT if edit_variant == AUTO else edit_variant
                return (build_tiny_edit_components(variant, storage=storage, compute_dtype=dtype, device=device),)
            qwen21 = qwen_image21_settings(source, transformer, text_encoder, diffusers_folder)
            if qwen21 is not None:  # 2.1 has no variants: it edits when its dataset has reference images
                if edit_variant != AUTO:
                    raise UserInputError(f"edit_variant is {edit_variant!r}, but the model is Qwen-Image 2.1, which "
                                         "has no Edit variants: set edit_variant to auto.")
                return (load_recognised(source, device, storage=storage, compute_dtype=compute_dtype,
                                        diffusers_folder=diffusers_folder, **qwen21),)
            if source == DIFFUSERS:
                if not diffusers_folder.strip():
                    raise UserInputError("diffusers_folder is empty: enter the path of a diffusers Qwen-Image-Edit folder.")
                return (load_edit_diffusers_dir(diffusers_folder.strip(), storage=storage, compute_dtype=dtype,
                                                device=device, variant=edit_variant),)
            paths = [host.model_file_path(kind, name) for kind, name in
                     (("diffusion_models", transformer), ("text_encoders", text_encoder), ("vae", vae))]
            beside = any(c.is_dir() for c in tokenizer_candidates(None, paths[1]))
            tokenizer = None if beside else host.bundled_qwen_tokenizer()
            return (load_edit_single_files(*paths, tokenizer_dir=tokenizer, storage=storage, compute_dtype=dtype,
                                           device=device, text_encoder_fp8=text_encoder_fp8, variant=edit_variant),)


class QwenLoRAEditDataset:
    DESCRIPTION = (
        "An edit dataset: per sample a target image, its .txt caption (the edit instruction) and 1 to 3 control "
        "images: name_control.png, name_control_2.png, name_control_3.png beside it, or control/name.png, "
        "control/name_2.png, ... Buckets come from the target; controls keep their aspect ratio and are sized by "
        "the edit model's rule. Qwen-Image 2.1 (from either Load node) trains reference-image editing on it: the "
        "controls are its reference images. Errors name the file to fix."
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
    OUTPUT_TOOLTIPS = ("The edited image.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": QwenLoRAPreview.INPUT_TYPES()["required"], "optional": {
            f"control_image_{i}": ("IMAGE", {"tooltip": f"Control image {i} (Picture {i}) to edit, e.g. from a Load "
                                            "Image. Unconnected: the first training sample's controls. A prompt with "
                                            "canvas images is encoded now (the text encoder is loaded for it)."})
            for i in (1, 2, 3)
        }}

    def preview(self, trainer, prompt, width, height, steps, cfg, preview_seed, weights="raw", control_image_1=None,
                control_image_2=None, control_image_3=None):
        trainer.require_live()
        if not takes_control_images(trainer):
            raise UserInputError(f"{EDIT_PREVIEW} edits control images, but this trainer trains "
                                 f"{trainer.components.family.name}, a text-to-image model: use {PREVIEW} "
                                 "(QwenLoRAPreview) instead (Qwen-Image 2.1 edits when it trains on an Edit "
                                 "Dataset).")
        controls = [c for c in (control_image_1, control_image_2, control_image_3) if c is not None]
        return preview_image(trainer, prompt, width, height, steps, cfg, preview_seed, controls, weights)
