"""Qwen-Image model parts: loading, float8 storage, prompt and latent encoding, tiny test models.

The names below are imported on first use (PEP 562), not when the package is: `config.py` takes its
preset choices from `models.qwen_arch` (pure data), and importing the config must not pull in torch,
diffusers and transformers through this package's loaders.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "QwenImageComponents": "components",
    "module_fingerprint": "components",
    "load_diffusers_dir": "diffusers_dir",
    "save_diffusers_dir": "diffusers_dir",
    "STORAGE_MODES": "float8",
    "store_block_linears": "float8",
    "load_single_files": "single_file",
    "TEXT_ENCODER_FP8_MODES": "text_encoder_file",
    "build_tiny_components": "tiny",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
