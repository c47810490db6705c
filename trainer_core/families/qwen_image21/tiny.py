"""A tiny Qwen-Image 2.1 model set with random weights: the real classes, configs small enough for a CPU.

    transformer   QwenImage21Transformer2DModel: 2 single-stream blocks, 2 heads of 16 (RoPE axes 4/6/6),
                  text width 16, 8 latent channels, patch 1
    VAE           AutoencoderKLQwenImage21: RGBA in and out, 16x (four spatial downsamplings), 8 channels
    text encoder  Qwen3VLForConditionalGeneration: 2 layers of width 16, a one-layer vision tower with the
                  real 16 px patches and 2 x 2 merge (one vision token per 32 x 32 px, one per 2 x 2 latent cells)
    processor     processor.py around the tiny tokenizer of models/tiny.py

The processor takes the tokenizer's place in the model set (`components.tokenizer`): the pipeline reads
both through it.
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderKLQwenImage21, QwenImage21Transformer2DModel
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from ...models.components import QwenImageComponents
from ...models.float8 import store_block_linears
from ...models.tiny import SPECIAL_TOKENS, build_tiny_tokenizer
from ..registry import get_family
from .conditioning import NAME
from .processor import build_processor

TINY_LATENT_CHANNELS = 8

TINY_TRANSFORMER = dict(
    patch_size=1, in_channels=TINY_LATENT_CHANNELS, out_channels=TINY_LATENT_CHANNELS, num_layers=2,
    attention_head_dim=16, num_attention_heads=2, context_in_dim=16, mlp_ratio=3, axes_dims_rope=(4, 6, 6),
)

TINY_VAE = dict(
    base_dim=8, decoder_base_dim=12, z_dim=TINY_LATENT_CHANNELS, dim_mult=[1, 2, 2, 2, 2], num_res_blocks=1,
    temperal_downsample=[False, True, True, True], in_channels=4, out_channels=4,
    latents_mean=[0.0] * TINY_LATENT_CHANNELS, latents_std=[1.0] * TINY_LATENT_CHANNELS,
)

# Qwen-Image 2.1's scheduler settings (its scheduler_config.json as published; the pipeline reads
# base/max image sequence length and shift for `mu`).
QWEN_IMAGE21_SCHEDULER_CONFIG = {
    "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 8192, "max_shift": 0.9,
    "num_train_timesteps": 1000, "shift": 1.0, "shift_terminal": 0.02, "time_shift_type": "exponential",
    "use_dynamic_shifting": True,
}


def tiny_text_config(vocab_size: int, special_ids: dict[str, int]) -> dict:
    return dict(
        text_config=dict(
            vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=8,
            rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [2, 1, 1],
                             "mrope_interleaved": True},
            bos_token_id=None, eos_token_id=special_ids["<|im_end|>"], pad_token_id=special_ids["<|endoftext|>"],
        ),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                           deepstack_visual_indexes=[]),
        image_token_id=special_ids["<|image_pad|>"], video_token_id=special_ids["<|video_pad|>"],
        vision_start_token_id=special_ids["<|vision_start|>"], vision_end_token_id=special_ids["<|vision_end|>"],
    )


def build_tiny_text_encoder(seed: int, dtype: torch.dtype):
    """(Qwen3-VL text encoder, its processor), random weights from `seed`."""
    tokenizer = build_tiny_tokenizer()
    special_ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Qwen3VLConfig(**tiny_text_config(len(tokenizer), special_ids))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = Qwen3VLForConditionalGeneration(config)
    return text_encoder.to(dtype).requires_grad_(False).eval(), build_processor(tokenizer, config.vision_config)


def build_tiny_qwen_image21(seed: int = 0, storage: str = "float32", compute_dtype: torch.dtype = torch.float32,
                            device: str | torch.device = "cpu") -> QwenImageComponents:
    """The tiny Qwen-Image 2.1 model set (`build_tiny_qwen_image21_set`)."""
    return build_tiny_qwen_image21_set(get_family(NAME), seed, storage, compute_dtype, device)


def build_tiny_qwen_image21_set(family, seed: int = 0, storage: str = "float32",
                                compute_dtype: torch.dtype = torch.float32,
                                device: str | torch.device = "cpu") -> QwenImageComponents:
    """Tiny transformer + VAE + Qwen3-VL + processor of Qwen-Image 2.1, random weights from `seed`, of `family`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = QwenImage21Transformer2DModel(**TINY_TRANSFORMER)
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLQwenImage21(**TINY_VAE)
    device = torch.device(device)
    if compute_dtype != torch.float32:
        transformer.to(compute_dtype)
        vae.to(compute_dtype)
    transformer.requires_grad_(False).eval()
    store_block_linears(transformer, storage)
    vae.to(device).requires_grad_(False).eval()
    text_encoder, processor = build_tiny_text_encoder(seed + 2, compute_dtype)
    return QwenImageComponents(
        transformer=transformer, vae=vae, text_encoder=text_encoder.to(device), tokenizer=processor,
        scheduler_config=dict(QWEN_IMAGE21_SCHEDULER_CONFIG), compute_dtype=compute_dtype, device=device,
        name=f"tiny-qwen-image-2.1-seed{seed}", storage=storage, family=family,
        text_encoder_loader=lambda: build_tiny_text_encoder(seed + 2, compute_dtype),
        processor_loader=lambda: processor,  # small: kept for previews after the encoder is released
    )
