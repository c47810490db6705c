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


# --------------------------------------------------------------------------------------------------
# A newer ComfyUI's rules, for models that no runnable snapshot here has (Qwen-Image 2.1)


def comfy_key_map_newer(model_state: dict[str, tuple[int, ...]]) -> dict[str, tuple[str, tuple[int, int, int] | None]]:
    """LoRA key prefix -> (ComfyUI model weight key, row offset or None) for a model_base.QwenImage subclass
    (ComfyUI's QwenImage21 is one), restated from comfy/lora.py `model_lora_keys_unet` at Comfy-Org/ComfyUI
    17358c8f (read in the search index; the same rule at ec93dcac). `model_state`: the model's state-dict keys
    (all under `diffusion_model.`) and shapes.

    - every `diffusion_model.X.weight`: `lora_unet_<X, '.' -> '_'>` and `diffusion_model.X` (any model);
      comfy.utils.unet_to_diffusers adds nothing for a DiT (its config has no num_res_blocks);
    - the QwenImage branch: `X`, `transformer.X` and `lycoris_<X, '.' -> '_'>`, except that a fused
      `transformer_blocks.N.img_mlp.gate_up` ("Qwen Image 2.1 fuses gate_layer/proj at load; LoRAs address
      the halves") maps its two halves instead: `...img_mlp.gate_layer` -> rows [0, half), `...img_mlp.proj` ->
      rows [half, 2 half) of the fused weight (offset (dim 0, start, length), half = rows // 2), with the
      same three spellings; the fused name itself is then reachable only as `diffusion_model.` / `lora_unet_`."""
    key_map: dict[str, tuple[str, tuple[int, int, int] | None]] = {}
    for k in model_state:
        if k.startswith("diffusion_model."):
            if k.endswith(".weight"):
                stem = k[len("diffusion_model."):-len(".weight")]
                key_map[f"lora_unet_{stem.replace('.', '_')}"] = (k, None)
                key_map[k[:-len(".weight")]] = (k, None)
            else:
                key_map[k] = (k, None)
    for k, shape in model_state.items():
        if k.startswith("diffusion_model.") and k.endswith(".weight"):
            stem = k[len("diffusion_model."):-len(".weight")]
            targets = [(stem, (k, None))]
            if stem.endswith(".img_mlp.gate_up"):
                half = shape[0] // 2
                targets = [(stem.replace(".gate_up", ".gate_layer"), (k, (0, 0, half))),
                           (stem.replace(".gate_up", ".proj"), (k, (0, half, half)))]
            for name, to in targets:
                key_map[name] = to
                key_map[f"transformer.{name}"] = to
                key_map[f"lycoris_{name.replace('.', '_')}"] = to
    return key_map

