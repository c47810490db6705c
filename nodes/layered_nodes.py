"""Qwen-Image-Layered: finding a layered dataset (the engine: the family that trains on layered datasets).

A Layered model set comes from the plain Load node (it knows Layered from the transformer file); the other
nodes (Cache, Init Trainer, Train Steps, Preview, Save, ...) take it and this dataset as they are: Cache
encodes the composite and its layers as frames, Preview decomposes the first sample's composite (or an
image given to it) and lays the layers out side by side.
"""

from __future__ import annotations

from ..trainer_core.core.config import CUSTOM_FOLDER, DatasetConfig
from ..trainer_core.families import family_for_dataset
from .common import CATEGORY, DATASET
from .data_nodes import QwenLoRADataset, dataset_folder

LAYERED = "layered"  # the dataset convention this node finds (a composite and its RGBA layers)


class QwenLoRALayeredDataset:
    DESCRIPTION = (
        "A Qwen-Image-Layered dataset: per sample a composite image, its .txt caption, and its RGBA layers "
        "name_layer_1.png, name_layer_2.png, ... beside it (numbered from 1 without gaps, each the composite's size, "
        "with an alpha channel; layer N is the N-th image the Layered pipeline returns). Errors name the file to fix."
    )
    CATEGORY = CATEGORY
    FUNCTION = "discover"
    RETURN_TYPES = (DATASET, "STRING")
    RETURN_NAMES = ("dataset", "summary")
    OUTPUT_TOOLTIPS = ("The composites, captions, layers and buckets found.", "What was found.")

    @classmethod
    def INPUT_TYPES(cls):
        spec = QwenLoRADataset.INPUT_TYPES()
        # A Layered sample keeps its alpha always (its layers are what the model learns): no transparency choice.
        return {"required": spec["required"], "optional": {k: v for k, v in spec["optional"].items()
                                                           if k != "transparency"}}

    IS_CHANGED = QwenLoRADataset.IS_CHANGED  # the folder's state (a layer file counts too)

    def discover(self, folder, input_folder=CUSTOM_FOLDER, validation_images=0, **settings):
        cfg = DatasetConfig(folder=dataset_folder(folder, input_folder), input_folder=input_folder,
                            validation_images=validation_images, **settings)
        dataset = family_for_dataset(LAYERED).load_dataset(cfg)
        return (dataset, dataset.summary())
