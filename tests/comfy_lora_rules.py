"""ComfyUI's rules for matching LoRA keys to a Qwen-Image model, restated for tests (comfy/lora.py:
model_lora_keys_unet, and load_lora with the LoRA adapter's accepted key suffixes)."""

from __future__ import annotations

ADAPTER_SUFFIXES = (
    ".lora_up.weight", ".lora_down.weight", ".lora_mid.weight", "_lora.up.weight", "_lora.down.weight",
    ".lora_B.weight", ".lora_A.weight", ".lora.up.weight", ".lora.down.weight", ".lora_B", ".lora_A",
    ".lora_B.default.weight", ".lora_A.default.weight", ".alpha", ".dora_scale",
)


def comfy_key_map(diffusers_state_keys) -> dict[str, str]:
    """LoRA key prefix -> ComfyUI model weight key, for a Qwen-Image model with these module names."""
    key_map = {}
    for key in diffusers_state_keys:
        k = f"diffusion_model.{key}"
        if k.endswith(".weight"):
            stem = k[len("diffusion_model."):-len(".weight")]
            key_map[f"lora_unet_{stem.replace('.', '_')}"] = k
            key_map[k[:-len(".weight")]] = k
            key_map[stem] = k  # QwenImage: bare module names
            key_map[f"transformer.{stem}"] = k
            key_map[f"lycoris_{stem.replace('.', '_')}"] = k
        else:
            key_map[k] = k
    return key_map


def unmatched_keys(lora_keys, key_map) -> list[str]:
    """Keys of a LoRA file that ComfyUI would report as 'lora key not loaded'."""
    loaded = set()
    for prefix in key_map:
        for suffix in ADAPTER_SUFFIXES:
            if f"{prefix}{suffix}" in lora_keys:
                loaded.add(f"{prefix}{suffix}")
    return sorted(set(lora_keys) - loaded)
