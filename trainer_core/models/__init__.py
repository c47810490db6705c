"""Qwen-Image model parts: loading, float8 storage, prompt and latent encoding, tiny test models."""

from .components import QwenImageComponents, module_fingerprint
from .diffusers_dir import load_diffusers_dir, save_diffusers_dir
from .float8 import STORAGE_MODES, store_block_linears
from .single_file import load_single_files
from .text_encoder_file import TEXT_ENCODER_FP8_MODES
from .tiny import build_tiny_components

__all__ = [
    "QwenImageComponents",
    "STORAGE_MODES",
    "TEXT_ENCODER_FP8_MODES",
    "build_tiny_components",
    "load_diffusers_dir",
    "load_single_files",
    "module_fingerprint",
    "save_diffusers_dir",
    "store_block_linears",
]
