"""Loading Qwen-Image for training."""

from __future__ import annotations

import torch

from ..trainer_core.errors import UserInputError
from ..trainer_core.models import STORAGE_MODES, build_tiny_components, load_diffusers_dir
from . import host
from .common import CATEGORY, MODELS, engine_mode

TINY = "tiny test model (random weights)"
DIFFUSERS = "diffusers folder"


def resolve_compute_dtype(choice: str, device: torch.device) -> torch.dtype:
    if choice == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, choice)


class QwenLoRALoadModels:
    DESCRIPTION = (
        "Loads Qwen-Image for LoRA training: transformer (block weights stored in float8 to halve its memory), "
        "text encoder and VAE. The output feeds the Cache and Init Trainer nodes."
    )
    CATEGORY = CATEGORY
    FUNCTION = "load"
    RETURN_TYPES = (MODELS,)
    RETURN_NAMES = ("models",)
    OUTPUT_TOOLTIPS = ("Qwen-Image parts for training (not a ComfyUI MODEL).",)

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "source": ([DIFFUSERS, TINY], {
                    "default": DIFFUSERS,
                    "tooltip": "Where the model comes from: a diffusers-format Qwen-Image folder, or the tiny random "
                               "model used for tests and the demo.",
                }),
                "diffusers_folder": ("STRING", {
                    "default": "", "tooltip": "Path of a diffusers Qwen-Image folder (with transformer/, vae/, "
                                              "text_encoder/, tokenizer/). Used when source is 'diffusers folder'.",
                }),
                "storage": (list(STORAGE_MODES), {
                    "default": "float8",
                    "tooltip": "How the transformer's block weights are stored: float8 (half of bf16's memory), "
                               "float8_scaled (a scale per row: more accurate), or bfloat16/float32.",
                }),
                "compute_dtype": (["auto", "bfloat16", "float32"], {
                    "default": "auto", "tooltip": "Precision of the computation: auto is bfloat16 on a GPU, "
                                                  "float32 on a CPU.",
                }),
            }
        }

    def load(self, source, diffusers_folder, storage, compute_dtype):
        device = host.compute_device()
        dtype = resolve_compute_dtype(compute_dtype, device)
        with engine_mode():
            if source == TINY:
                return (build_tiny_components(seed=0, storage=storage, compute_dtype=dtype, device=device),)
            if not diffusers_folder.strip():
                raise UserInputError("diffusers_folder is empty: enter the path of a diffusers Qwen-Image folder.")
            return (load_diffusers_dir(diffusers_folder.strip(), storage=storage, compute_dtype=dtype, device=device),)
