"""What the memory plan plans for the real Qwen-Image 2.1 (`ModelFamily.planned_arch`, `planned_parts`): its
transformer's numbers (diffusers' `QwenImage21Transformer2DModel` defaults are its config: 32 single-stream blocks,
32 heads x 128, SwiGLU 3 x 4096, context 4096, 64 channels, patch 1), its Qwen3-VL-8B text encoder and 16x RGBA VAE as
loaded, with the constants measured for them (tools/calibrate_qwen21.py), all on the meta device.
"""

from __future__ import annotations

import functools

import torch
from diffusers import AutoencoderKLQwenImage21, QwenImage21Transformer2DModel
from torch import nn
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from ...planner.arch import QwenImageArch, arch_from_transformer
from ...planner.inference import PartSizes, vae_image_channels, vision_fields
from .arch import QWEN3_VL_8B_CONFIG
from .processor import MAX_PIXELS, MIN_PIXELS


@functools.lru_cache(maxsize=1)
def real_arch21() -> QwenImageArch:
    """The real Qwen-Image 2.1 transformer's numbers, from a model built on the meta device."""
    with torch.device("meta"):
        return arch_from_transformer(QwenImage21Transformer2DModel())


# Qwen-Image 2.1's parts, measured by tools/calibrate_qwen21.py (same method as above): its VAE
# (`AutoencoderKLQwenImage21`, RGBA, 16x) per pixel per base channel, and what its Qwen3-VL forward holds per token
# beyond the hidden states, the MLP's transients and the logits (the pipeline runs the whole model, lm_head too).
# VAE at base_dim 96, 256 and 512 px: encode 139.2 / 556.8 MB, decode 421.5 / 1685.8 MB (its decoder is 144 wide,
# hence the larger decode figure per base channel). The text encoder's remainder measured -8184 B per token at hidden
# 512 (4 layers, 300 tokens) but +16104 B at the real width (4096, MLP 12288; 2 and 4 layers alike, 312 tokens:
# tools/calibrate_qwen21_references.py), which is what the real encoder holds: 16104.
VAE21_ENCODE_BYTES_PER_PIXEL_CHANNEL = 22.12
VAE21_DECODE_BYTES_PER_PIXEL_CHANNEL = 66.99
TEXT21_EXTRA_PER_TOKEN = 16104


@functools.lru_cache(maxsize=2)
def real_parts21(lm_head: bool = True) -> PartSizes:
    """Qwen-Image 2.1's Qwen3-VL-8B (`arch.QWEN3_VL_8B_CONFIG`, loaded whole: the folder loader
    reads `Qwen3VLForConditionalGeneration`, vision tower and lm_head included) and its VAE, on the meta device.
    `lm_head=False`: the encoder as ComfyUI's single file loads (text_file.py drops the head: no head weights, no
    logits)."""
    text = QWEN3_VL_8B_CONFIG["text_config"]
    with torch.device("meta"):
        encoder = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**QWEN3_VL_8B_CONFIG))
        vae = AutoencoderKLQwenImage21()
    linears = sum(m.weight.numel() for n, m in encoder.named_modules()
                  if isinstance(m, nn.Linear) and ".layers." in f".{n}")
    head = 0 if lm_head else encoder.lm_head.weight.numel()
    return PartSizes(
        text_encoder_params=sum(p.numel() for p in encoder.parameters()) - head, text_encoder_linear_params=linears,
        text_encoder_largest=text["vocab_size"] * text["hidden_size"], text_hidden=text["hidden_size"],
        text_layers=text["num_hidden_layers"], text_intermediate=text["intermediate_size"],
        text_kv_heads=text["num_key_value_heads"], text_head_dim=text["head_dim"],
        vision_min_pixels=MIN_PIXELS, vision_max_pixels=MAX_PIXELS,
        vae_params=sum(p.numel() for p in vae.parameters()), vae_base_dim=vae.config.base_dim,
        vae_image_channels=vae_image_channels(vae), vae_encode_per_pixel_channel=VAE21_ENCODE_BYTES_PER_PIXEL_CHANNEL,
        vae_decode_per_pixel_channel=VAE21_DECODE_BYTES_PER_PIXEL_CHANNEL,
        text_extra_per_token=TEXT21_EXTRA_PER_TOKEN, text_logits_per_token=text["vocab_size"] if lm_head else 0,
        one_byte_text_encoder_file="qwen3vl_8b_int8_convrot", one_byte_text_encoder_format="int8",
        **vision_fields(encoder))
