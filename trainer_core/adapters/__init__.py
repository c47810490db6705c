"""The adapter: peft injection (lora.py; LoKr and LoHa in lycoris.py) and every LoRA file layout in and out
(lora_files.py)."""
