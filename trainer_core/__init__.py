"""Qwen-Image LoRA training engine. Imports nothing from ComfyUI; usable from scripts and the CLI."""

__version__ = "0.1.0"
