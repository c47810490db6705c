"""Facts of the Qwen-Image 2.1 architecture: its block Linears and LoRA presets, declared for the lower layers
(`ARCHITECTURE`, models/architecture.py), and the shapes of its real text encoder for the memory plan.

Qwen-Image 2.1 (diffusers 0.42.1 `QwenImage21Transformer2DModel`) is single-stream: text, condition and
target tokens run through the same Linears of each block, and one `modulation` Linear outside the blocks
feeds them all (no per-block modulation). Its MLP is SwiGLU: `img_mlp.gate_layer` and `img_mlp.proj`
(both dim -> 3 dim) and `img_mlp.out`. ComfyUI's files may hold the first two fused as `img_mlp.gate_up`
(gate rows first: diffusers' `convert_qwen_image21_transformer_checkpoint_to_diffusers` says so).

Pure data (no torch at module level), like `models.qwen_arch`; the preset names are Qwen-Image's, so the
`targets` setting means the same for both.
"""

from __future__ import annotations

from ...models.architecture import TransformerArchitecture, declare_architecture

TRANSFORMER_CLASS = "QwenImage21Transformer2DModel"

ATTENTION: tuple[str, ...] = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0")
MLP: tuple[str, ...] = ("img_mlp.gate_layer", "img_mlp.proj", "img_mlp.out")
BLOCK_LINEARS: tuple[str, ...] = ATTENTION + MLP

LORA_TARGET_PRESETS: dict[str, tuple[str, ...]] = {
    "attention": ATTENTION,
    "attention+mlp": BLOCK_LINEARS,
    "all": BLOCK_LINEARS,  # no modulation Linear inside a block
}

# The fused MLP input projection of ComfyUI's files: rows = [gate_layer; proj].
FUSED_MLP = "img_mlp.gate_up"
FUSED_PARTS: tuple[str, str] = ("img_mlp.gate_layer", "img_mlp.proj")

# What tells a 2.1 transformer file from a Qwen-Image one (which has `txt_norm.weight` instead).
TRANSFORMER_PROBE = "txt_in.text_norm.weight"

# Pixels per latent cell of its VAE (16x: four spatial downsamplings) and latent channels.
VAE_SCALE_FACTOR = 16
LATENT_CHANNELS = 64


# ComfyUI's 2.1 key map reads kohya names only onto the weights a model holds: a fused `img_mlp.gate_up` (ComfyUI's
# own 2.1 files) leaves the MLP pair's LoRAs unloaded, silently (measured on ComfyUI's 2.1 model).
KOHYA_REFUSAL = ("LoRA layout kohya is not one ComfyUI reads whole for Qwen-Image 2.1: with a 2.1 model file whose MLP "
                 "is fused (ComfyUI's own files) every block's img_mlp LoRAs are left out without an error. Save it in "
                 "the comfyui layout (ComfyUI loads it with every key used, fused or split) or diffusers.")

ARCHITECTURE = declare_architecture(TransformerArchitecture(
    transformer_class=TRANSFORMER_CLASS, lora_presets=LORA_TARGET_PRESETS, dead_in_last_block=(),
    comfyui_lora_prefix="",  # ComfyUI's 2.1 key map reads bare diffusers names
    kohya_refusal=KOHYA_REFUSAL, fused_linears={FUSED_MLP: FUSED_PARTS},
    per_block_modulation=False,  # its one modulation Linear sits outside the blocks
    single_stream=True, mlp_input_linear="img_mlp.proj", vae_scale_factor=VAE_SCALE_FACTOR))


# The real text encoder's shapes, for the memory planner only (no weights are built from it): Qwen3-VL-8B as
# published (its language model is Qwen3-8B: 36 layers of width 4096 = the transformer's `context_in_dim`, 32
# heads, 8 KV heads, MLP 12288, untied embeddings; a 27-block vision tower of width 1152 merged to 4096).
# Assumed from the published Qwen3-VL-8B config, not read from a file here: transformers' own Qwen3VLConfig
# defaults are another size (MLP 22016, 32 KV heads). Keys as `transformers.Qwen3VLConfig` takes them.
QWEN3_VL_8B_CONFIG: dict = {
    "text_config": {
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False,
    },
    "vision_config": {
        "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "patch_size": 16,
        "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 4096, "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [8, 16, 24],
    },
    "tie_word_embeddings": False,
}
