"""The small pretrained Qwen-Image shipped with the pack: the real classes at small widths, trained on coloured shapes.

Unlike the tiny random model (tiny.py), it draws what its prompt names: a circle, square or triangle in one of
five colours (trainer_core/shapes.py), at one of five places, on a white or black background, at 64x64 px.
It has never seen a star, which is what the demo LoRA teaches it.

- transformer: `QwenImageTransformer2DModel`, 4 blocks, 4 heads x 32 (inner width 128; at 64 it drew blobs of
  the right colour and place, rarely the right shape), RoPE axes (8, 12, 12);
- VAE: `AutoencoderKLQwenImage`, base_dim 16, 16 latent channels (Qwen-Image's own count, so ComfyUI's latent
  format for Qwen-Image fits it), 4x downscale: a 64x64 picture is a (16, 16, 16) latent, 8 x 8 = 64 tokens;
- text encoder and tokenizer: the tiny random Qwen2.5-VL of tiny.py (hidden size 16), frozen: the transformer
  learned to read its features.

`tools/train_shapes_model.py` trains it from a seed and writes the files below, in ComfyUI's single-file
layout; they load through the same loader as ComfyUI's real files (`single_file.load_single_files`):

    pretrained/qwen_image_shapes/diffusion_models/qwen_image_shapes_bf16.safetensors   (+ .json config)
    pretrained/qwen_image_shapes/text_encoders/qwen_2.5_vl_shapes.safetensors
    pretrained/qwen_image_shapes/vae/qwen_image_shapes_vae.safetensors
    pretrained/qwen_image_shapes/tokenizer/
"""

from __future__ import annotations

from pathlib import Path

import torch

from .components import QwenImageComponents
from .qwen_arch import PATCH_SIZE
from .tiny import build_tiny_text_encoder

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "pretrained" / "qwen_image_shapes"
TEXT_ENCODER_SEED = 2  # the tiny random encoder's seed (frozen; the transformer was trained on its features)
NAME = "qwen-image-shapes"
LATENT_CHANNELS = 16  # Qwen-Image's own (ComfyUI's latent format for Qwen-Image has 16 channels)

SHAPES_TRANSFORMER = dict(
    patch_size=PATCH_SIZE, in_channels=PATCH_SIZE**2 * LATENT_CHANNELS, out_channels=LATENT_CHANNELS,
    num_layers=4, attention_head_dim=32, num_attention_heads=4, joint_attention_dim=16, axes_dims_rope=(8, 12, 12),
)
# latents_mean / latents_std are measured by the training script over its pictures and written into the file's
# config: the transformer then sees latents of about unit variance per channel, as the real model does.
SHAPES_VAE = dict(base_dim=16, z_dim=LATENT_CHANNELS, dim_mult=[1, 2, 4], num_res_blocks=1,
                  temperal_downsample=[False, True])


def shipped_files(root: str | Path = SHIPPED_DIR) -> dict[str, Path]:
    """Paths of the model's parts under `root` (ComfyUI's model folder layout)."""
    root = Path(root)
    return {
        "transformer": root / "diffusion_models" / "qwen_image_shapes_bf16.safetensors",
        "text_encoder": root / "text_encoders" / "qwen_2.5_vl_shapes.safetensors",
        "vae": root / "vae" / "qwen_image_shapes_vae.safetensors",
        "tokenizer": root / "tokenizer",
    }


def have_shipped_model(root: str | Path = SHIPPED_DIR) -> bool:
    return all(p.exists() for p in shipped_files(root).values())


def load_shapes_model(storage: str = "float8", compute_dtype: torch.dtype = torch.float32,
                      device: str | torch.device = "cpu", root: str | Path = SHIPPED_DIR, *,
                      family) -> QwenImageComponents:
    """The shipped model as a (lazy) model set of `family`, read by the loader of ComfyUI's own files."""
    from ..core.errors import UserInputError
    from .single_file import load_single_files

    files = shipped_files(root)
    if not have_shipped_model(root):
        raise UserInputError(
            f"the small pretrained model's files are not in {root} (none ship yet): make them with "
            "`python tools/train_shapes_model.py`, or choose the tiny test model.")
    components = load_single_files(files["transformer"], files["text_encoder"], files["vae"],
                                   tokenizer_dir=files["tokenizer"], storage=storage, compute_dtype=compute_dtype,
                                   device=device, text_encoder_fp8="dequantize", family=family)
    components.name = NAME
    return components


def build_untrained(seed: int):
    """(transformer, vae, text_encoder, tokenizer) of this architecture in float32: transformer and VAE with
    fresh random weights from `seed` (what the training script starts from), the text encoder as shipped."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = QwenImageTransformer2DModel(**SHAPES_TRANSFORMER)
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLQwenImage(**SHAPES_VAE, latents_mean=[0.0] * LATENT_CHANNELS,
                                     latents_std=[1.0] * LATENT_CHANNELS)
    text_encoder, tokenizer = build_tiny_text_encoder(TEXT_ENCODER_SEED, torch.float32)
    return transformer, vae, text_encoder, tokenizer
