"""The LoRA: peft injection (lora.py) and every LoRA file layout in and out (lora_files.py)."""
