"""Qwen-Image LoRA training engine. Imports nothing from ComfyUI; usable from scripts and the CLI."""

from .core.quiet import quiet_library_messages

__version__ = "0.1.0"

quiet_library_messages()  # before anything imports peft or bitsandbytes
