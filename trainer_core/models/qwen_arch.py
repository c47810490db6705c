"""Facts of the Qwen-Image architecture, in one place: module names, LoRA target presets, patch size.

Why one module: these names were spelled out again in the config, the LoRA code, the file layouts and
the memory planner; a second spelling can drift from the first silently (a kohya key that no longer
maps, a planner term for a module the trainer does not adapt). Everything else imports them from here.

Pure data: no torch, no diffusers. `config.py` (the bottom of the engine) takes its preset choices from
here, and importing it must stay cheap. `tests/engine/test_qwen_arch.py` checks the names and constants against
diffusers' `QwenImageTransformer2DModel` and `AutoencoderKLQwenImage`, so a diffusers release that
renames a module fails a test instead of training the wrong layers.

What is not here, on purpose: numbers a loaded model's config tells (block count, widths, latent
channels, the VAE's scale factor). Those are read from the model where they are used, so the tiny test
models and the real one go through the same code; the constants below are for files that do not say.
"""

from __future__ import annotations

from .architecture import TransformerArchitecture, declare_architecture

# ------------------------------------------------------------------------------------------------
# transformer

# diffusers' attribute (and state-dict prefix) of the block list: `transformer_blocks.<i>.<module>`.
BLOCKS = "transformer_blocks"

# The 14 Linear layers inside every `transformer_blocks.<i>` block, in diffusers' module names: the two
# modulations, joint attention (image q/k/v/out, text q/k/v/out) and the two streams' feed-forwards.
BLOCK_LINEARS: tuple[str, ...] = (
    "img_mod.1", "txt_mod.1",
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
    "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
    "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2",
)

# The same Linears by role, per stream (image: the latent tokens; text: the prompt tokens). The planner
# counts each stream's activations with these; the first MLP Linear's output width is the MLP width.
IMG_STREAM = dict(mod="img_mod.1", q="attn.to_q", k="attn.to_k", v="attn.to_v", out="attn.to_out.0",
                  mlp0="img_mlp.net.0.proj", mlp2="img_mlp.net.2")
TXT_STREAM = dict(mod="txt_mod.1", q="attn.add_q_proj", k="attn.add_k_proj", v="attn.add_v_proj",
                  out="attn.to_add_out", mlp0="txt_mlp.net.0.proj", mlp2="txt_mlp.net.2")

# The modulation Linears (D -> 6 D, applied to silu(timestep embedding), one row per sample). Their input never
# requires grad (the timestep embedders are frozen), so they never run a backward; with their outputs kept
# from the forward (streaming.runner.BlockRunner) the checkpoint recompute needs them neither: a swapped block's
# backward copies its other 12 Linears only.
MODULATION_LINEARS: tuple[str, ...] = (IMG_STREAM["mod"], TXT_STREAM["mod"])

_ATTENTION = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
              "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out")
_MLP = ("img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2")

# Which block Linears get a LoRA, per preset (the choices of `LoraConfig.targets`), in block order.
LORA_TARGET_PRESETS: dict[str, tuple[str, ...]] = {
    "attention": _ATTENTION,
    "attention+mlp": _ATTENTION + _MLP,
    "all": BLOCK_LINEARS,
}

# In the last block the text stream's output is thrown away (only the image stream reaches `proj_out`),
# so a LoRA on these modules there would never receive a gradient: leave them out.
DEAD_IN_LAST_BLOCK: tuple[str, ...] = ("attn.add_q_proj", "attn.to_add_out", "txt_mlp.net.0.proj", "txt_mlp.net.2")

# Qwen-Image's MMDiT, as the layers below the families ask of an architecture (models/architecture.py): every family
# whose transformer is a `QwenImageTransformer2DModel` (Qwen-Image, 2512, Edit, Layered) trains this one.
MMDIT = declare_architecture(TransformerArchitecture(
    transformer_class="QwenImageTransformer2DModel", lora_presets=LORA_TARGET_PRESETS,
    dead_in_last_block=DEAD_IN_LAST_BLOCK, comfyui_lora_prefix="diffusion_model.", per_block_modulation=True,
    single_stream=False, mlp_input_linear=IMG_STREAM["mlp0"], vae_scale_factor=8))

# The Linears outside the blocks: embedders of the latent tokens, the prompt and the timestep, the final
# norm's modulation and the output projection. They stay in the compute dtype (never float8: they are
# small and precision-sensitive) and get no LoRA; other tools' LoRA files may still adapt them.
OUTER_LINEARS: tuple[str, ...] = (
    "img_in", "txt_in",
    "time_text_embed.timestep_embedder.linear_1", "time_text_embed.timestep_embedder.linear_2",
    "norm_out.linear", "proj_out",
)

# Latent cells per token side: the transformer packs 2 x 2 latent cells into one token of
# PATCH_SIZE**2 x latent channels (in_channels = 4 x the VAE's z_dim). Single files do not record it;
# Qwen-Image and ComfyUI both use 2.
PATCH_SIZE = 2

# RoPE axes (frame, height, width) of the real model; their sum is the attention head size (128).
AXES_DIMS_ROPE: tuple[int, int, int] = (16, 56, 56)

# ------------------------------------------------------------------------------------------------
# VAE latents

# Qwen-Image's vae/config.json: per-channel latent statistics (latents are normalised with them before
# the transformer sees them). The same numbers are ComfyUI's comfy/latent_formats.py Wan21
# latents_mean/latents_std and diffusers' AutoencoderKLQwenImage defaults. A VAE file does not hold them.
LATENTS_MEAN: tuple[float, ...] = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)
LATENTS_STD: tuple[float, ...] = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)

# ------------------------------------------------------------------------------------------------
# text encoder

# Qwen2.5-VL 7B Instruct as Qwen-Image uses it (its hidden size is the transformer's joint_attention_dim
# 3584). Text model: ComfyUI's comfy/text_encoders/llama.py Qwen25_7BVLI_Config (vocab 152064, hidden
# 3584, MLP 18944, 28 layers, 28 heads of 128, 4 KV heads, RMSNorm eps 1e-6, RoPE theta 1e6, M-RoPE
# sections 16/24/24), written the way transformers 5 takes it. Vision tower (not loaded for text-to-image
# training, kept for a complete config and for the planner's parameter count): comfy/text_encoders/
# qwen_vl.py defaults with ComfyUI's width 1280. Token ids: ComfyUI's qwen25_tokenizer/tokenizer_config.json.
QWEN25_VL_7B_CONFIG = {
    "model_type": "qwen2_5_vl",
    "text_config": {
        "model_type": "qwen2_5_vl_text",
        "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_act": "silu",
        "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "attention_dropout": 0.0,
        "use_sliding_window": False, "sliding_window": 32768, "max_window_layers": 28,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
        "bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643, "tie_word_embeddings": False,
    },
    "vision_config": {
        "model_type": "qwen2_5_vl_vision",
        "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "out_hidden_size": 3584,
        "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2, "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "in_channels": 3, "hidden_act": "silu",
    },
    "image_token_id": 151655, "video_token_id": 151656,
    "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "tie_word_embeddings": False,
}


def block_module(index: int, module: str) -> str:
    """Full module name of `module` (a name in BLOCK_LINEARS) in block `index`."""
    return f"{BLOCKS}.{index}.{module}"


def split_block_module(full_name: str) -> tuple[int, str]:
    """'transformer_blocks.<i>.<module>' -> (i, module)."""
    _, index, module = full_name.split(".", 2)
    return int(index), module
