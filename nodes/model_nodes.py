"""Loading Qwen-Image for training."""

from __future__ import annotations

import torch

from ..trainer_core.errors import UserInputError
from ..trainer_core.models import (
    STORAGE_MODES, TEXT_ENCODER_FP8_MODES, build_tiny_components, load_diffusers_dir, load_single_files,
)
from ..trainer_core.models.tokenizer import tokenizer_candidates
from . import host
from .common import CATEGORY, MODELS, engine_mode

FILES = "ComfyUI model files"
DIFFUSERS = "diffusers folder"
TINY = "tiny test model (random weights)"

# The file names of ComfyUI's repackaged Qwen-Image, preselected when present.
DEFAULT_FILES = {
    "diffusion_models": "qwen_image_fp8_e4m3fn.safetensors",
    "text_encoders": "qwen_2.5_vl_7b_fp8_scaled.safetensors",
    "vae": "qwen_image_vae.safetensors",
}


def resolve_compute_dtype(choice: str, device: torch.device) -> torch.dtype:
    if choice == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, choice)


def _file_choice(kind: str, tooltip: str) -> tuple:
    files = host.model_file_list(kind)
    default = DEFAULT_FILES[kind] if DEFAULT_FILES[kind] in files else (files[0] if files else "")
    return (files, {"default": default, "tooltip": tooltip})


class QwenLoRALoadModels:
    DESCRIPTION = (
        "Loads Qwen-Image for LoRA training from the files ComfyUI already uses (diffusion_models, "
        "text_encoders, vae; fp8, fp8-scaled or bf16), or from a diffusers folder. The transformer's block "
        "weights are stored in float8 to halve their memory. The output feeds the Cache and Init Trainer nodes."
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
                "source": ([FILES, DIFFUSERS, TINY], {
                    "default": FILES,
                    "tooltip": "Where the model comes from: the three files below, a diffusers-format folder, or "
                               "the tiny random model used for tests.",
                }),
                "transformer": _file_choice("diffusion_models", "Qwen-Image transformer file from "
                                            "models/diffusion_models (qwen_image_fp8_e4m3fn or qwen_image_bf16)."),
                "text_encoder": _file_choice("text_encoders", "Qwen2.5-VL 7B text encoder from models/text_encoders "
                                             "(qwen_2.5_vl_7b_fp8_scaled or qwen_2.5_vl_7b)."),
                "vae": _file_choice("vae", "Qwen-Image VAE from models/vae (qwen_image_vae)."),
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
                "text_encoder_fp8": (list(TEXT_ENCODER_FP8_MODES), {
                    "default": "dequantize",
                    "tooltip": "An fp8-scaled text encoder: dequantize to the compute dtype while loading (faster "
                               "caching), or keep its float8 weights (half the memory while caching).",
                }),
            }
        }

    def load(self, source, transformer, text_encoder, vae, diffusers_folder, storage, compute_dtype,
             text_encoder_fp8):
        device = host.compute_device()
        dtype = resolve_compute_dtype(compute_dtype, device)
        with engine_mode():
            if source == TINY:
                return (build_tiny_components(seed=0, storage=storage, compute_dtype=dtype, device=device),)
            if source == DIFFUSERS:
                if not diffusers_folder.strip():
                    raise UserInputError("diffusers_folder is empty: enter the path of a diffusers Qwen-Image folder.")
                return (load_diffusers_dir(diffusers_folder.strip(), storage=storage, compute_dtype=dtype,
                                           device=device),)
            paths = [host.model_file_path(kind, name) for kind, name in
                     (("diffusion_models", transformer), ("text_encoders", text_encoder), ("vae", vae))]
            # A tokenizer folder beside the files wins; otherwise the Qwen2.5 tokenizer ComfyUI ships.
            beside = any(c.is_dir() for c in tokenizer_candidates(None, paths[1]))
            tokenizer = None if beside else host.bundled_qwen_tokenizer()
            return (load_single_files(*paths, tokenizer_dir=tokenizer, storage=storage, compute_dtype=dtype,
                                      device=device, text_encoder_fp8=text_encoder_fp8),)
