"""Loading Qwen-Image for training."""

from __future__ import annotations

import torch

from ..trainer_core.config import MODEL_SOURCES, LoadConfig
from ..trainer_core.errors import UserInputError
from ..trainer_core.models import build_tiny_components, load_diffusers_dir, load_single_files
from ..trainer_core.models.tokenizer import tokenizer_candidates
from . import host
from .common import CATEGORY, MODELS, engine_mode
from .widgets import widgets

FILES, DIFFUSERS, TINY = MODEL_SOURCES


def resolve_compute_dtype(choice: str, device: torch.device) -> torch.dtype:
    if choice == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, choice)


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
        return {"required": widgets(LoadConfig)}

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
