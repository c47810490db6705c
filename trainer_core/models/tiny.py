"""Tiny Qwen-Image parts with random weights: the real classes, configs small enough for a CPU.

Used by the demo and the tests (no real weights exist on CI machines). The configs follow the rules
the real classes impose: transformer in_channels = 4 x VAE z_dim (2 x 2 patches, `qwen_arch.PATCH_SIZE`);
attention_head_dim = sum of the RoPE axes; joint_attention_dim = text encoder hidden size; the text
config's mrope_section sums to head_dim / 2. The tokenizer is a small byte-level BPE trained offline on a fixed corpus
(deterministic), wrapped in transformers' `Qwen2Tokenizer` with Qwen's special tokens.
"""

from __future__ import annotations

import json

import torch

from .components import QwenImageComponents
from .float8 import store_block_linears
from .qwen_arch import PATCH_SIZE
from .scheduler import QWEN_IMAGE_SCHEDULER_CONFIG

SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
)

# Words of the chat template and of the demo's captions, so the BPE learns a few merges.
_TOKENIZER_CORPUS = (
    "Describe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background",
    "system user assistant",
    "a red circle on a blue background, a green square, a yellow triangle, a white stripe pattern",
)

TINY_LATENT_CHANNELS = 4

TINY_TRANSFORMER = dict(
    patch_size=PATCH_SIZE, in_channels=PATCH_SIZE**2 * TINY_LATENT_CHANNELS, out_channels=TINY_LATENT_CHANNELS, num_layers=2,
    attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=(8, 4, 4),
)

# 8 channels at the first level (Layered's tiny VAE has as few): its 3-D convolutions were the largest single cost
# of the test suite at 24 (14 s of 129 s in a profile of five test files), and no test needs a wider one.
TINY_VAE = dict(
    base_dim=8, z_dim=TINY_LATENT_CHANNELS, dim_mult=[1, 2, 4], num_res_blocks=1,
    temperal_downsample=[False, True],
    latents_mean=[0.0] * TINY_LATENT_CHANNELS, latents_std=[1.0] * TINY_LATENT_CHANNELS,
)


def tiny_text_config(vocab_size: int, special_ids: dict[str, int]) -> dict:
    return dict(
        text_config=dict(
            vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2]},
            bos_token_id=None, eos_token_id=special_ids["<|im_end|>"], pad_token_id=special_ids["<|endoftext|>"],
        ),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16,
                           fullatt_block_indexes=[0]),
        image_token_id=special_ids["<|image_pad|>"], video_token_id=special_ids["<|video_pad|>"],
        vision_start_token_id=special_ids["<|vision_start|>"], vision_end_token_id=special_ids["<|vision_end|>"],
    )


def build_tiny_tokenizer(vocab_size: int = 400):
    """A deterministic byte-level BPE wrapped as `Qwen2Tokenizer` (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    bpe.train_from_iterator(list(_TOKENIZER_CORPUS) * 8, trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return Qwen2Tokenizer(vocab=model["vocab"], merges=merges, additional_special_tokens=list(SPECIAL_TOKENS[1:]))


def build_tiny_components(
    seed: int = 0,
    storage: str = "float32",
    compute_dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    *,
    family,
) -> QwenImageComponents:
    """Tiny transformer + VAE + text encoder + tokenizer, random weights from `seed`, a model set of `family`."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = QwenImageTransformer2DModel(**TINY_TRANSFORMER)
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLQwenImage(**TINY_VAE)
    device = torch.device(device)
    if compute_dtype != torch.float32:  # built in float32; .to() is skipped when it would change nothing
        transformer.to(compute_dtype)
        vae.to(compute_dtype)
    transformer.requires_grad_(False).eval()
    store_block_linears(transformer, storage)
    vae.to(device).requires_grad_(False).eval()
    text_encoder, tokenizer = build_tiny_text_encoder(seed + 2, compute_dtype)
    return QwenImageComponents(
        transformer=transformer, vae=vae, text_encoder=text_encoder.to(device), tokenizer=tokenizer,
        scheduler_config=dict(QWEN_IMAGE_SCHEDULER_CONFIG), compute_dtype=compute_dtype, device=device, family=family,
        name=f"tiny-qwen-image-seed{seed}", storage=storage,
        text_encoder_loader=lambda: build_tiny_text_encoder(seed + 2, compute_dtype),
    )


def build_tiny_text_encoder(seed: int, dtype: torch.dtype):
    """(Qwen2.5-VL text encoder, tokenizer), random weights from `seed`."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = build_tiny_tokenizer()
    special_ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = Qwen2_5_VLForConditionalGeneration(
            Qwen2_5_VLConfig(**tiny_text_config(len(tokenizer), special_ids)))
    return text_encoder.to(dtype).requires_grad_(False).eval(), tokenizer
