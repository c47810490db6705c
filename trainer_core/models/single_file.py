"""Qwen-Image from the single files ComfyUI users have: transformer, text encoder, VAE (+ tokenizer folder).

    diffusion_models/qwen_image_fp8_e4m3fn.safetensors | qwen_image_bf16.safetensors   -> transformer_file.py
    text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors | qwen_2.5_vl_7b.safetensors   -> text_encoder_file.py
    vae/qwen_image_vae.safetensors                                                        -> vae_file.py

Before anything heavy is read, all three headers are opened and checked: each file must be the part it
was chosen as, and the parts must fit together (text width, latent channels), so a wrong choice fails
in a second with a message naming the file, not after 20 GB were loaded.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from ..core.errors import UserInputError
from .components import QwenImageComponents, vocabulary_bytes
from .file_identity import combined_identity, file_identity
from .layouts import detect_layout, int8_weights, split_scaled_fp8, strip_prefix
from .qwen_arch import PATCH_SIZE
from .safetensors_file import SafetensorsFile
from .scheduler import QWEN_IMAGE_SCHEDULER_CONFIG
from .text_encoder_file import TextEncoderFile, check_fp8_mode, our_name
from .tokenizer import load_tokenizer
from .transformer_file import TransformerFile
from .vae_file import VaeFile


def _shapes(path, part: str) -> dict[str, tuple[int, ...]]:
    """The file's tensor shapes by name without its prefix (header only); raises for a wrong part."""
    file = SafetensorsFile(path, part)
    _, prefix = detect_layout(file.path, part, file.keys)
    names = strip_prefix(file.keys, prefix)
    if part == "transformer":  # the 20 GB file: refuse unreadable weights now, not after the other parts loaded
        weights, scales = split_scaled_fp8(names, file)
        file.require_floating([*weights.values(), *scales.values()],
                              int8_ok=[weights[n] for n in int8_weights(file, names) if n in weights])
    return {name: file.shapes[key] for name, key in names.items()}


def check_files_fit(transformer: str | Path, text_encoder: str | Path, vae: str | Path) -> int:
    """Check each file is its part and that they fit together; return the encoder's vocabulary rows."""
    t = _shapes(transformer, "transformer")
    te = {our_name(n): s for n, s in _shapes(text_encoder, "text encoder").items()}
    v = _shapes(vae, "vae")
    try:
        joint_dim, in_channels = t["txt_in.weight"][1], t["img_in.weight"][1]  # (inner, joint), (inner, 4 * z)
    except KeyError as e:
        raise UserInputError(f"transformer file {transformer} lacks {e}: it is not a complete Qwen-Image transformer.") from e
    try:
        vocab_rows, text_width = te["model.language_model.embed_tokens.weight"]  # (vocab, hidden)
    except KeyError as e:
        raise UserInputError(f"text encoder file {text_encoder} has no token embeddings: it is not a complete "
                             "Qwen2.5-VL text encoder.") from e
    z_dim = (v.get("conv2.weight") or v.get("post_quant_conv.weight") or (None,))[0]  # Wan, diffusers name
    if text_width != joint_dim:
        raise UserInputError(
            f"text encoder file {text_encoder} makes features of width {text_width}, but transformer file "
            f"{transformer} takes {joint_dim}: they are not parts of the same model. Choose matching files."
        )
    if z_dim is not None and PATCH_SIZE**2 * z_dim != in_channels:  # a VAE without it is refused by its loader
        raise UserInputError(
            f"VAE file {vae} makes {z_dim}-channel latents, but transformer file {transformer} takes "
            f"{in_channels // PATCH_SIZE**2} (x 2x2 patches = {in_channels}): they are not parts of the same model."
        )
    return vocab_rows


def load_single_files(
    transformer: str | Path,
    text_encoder: str | Path,
    vae: str | Path,
    tokenizer_dir: str | Path | None = None,
    storage: str = "float8",
    compute_dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    text_encoder_fp8: str = "dequantize",
    vision: bool = False,
    extra_config: dict | None = None,
    *,
    family,
) -> QwenImageComponents:
    """A lazy model set over three files and a tokenizer folder (see tokenizer.py for where it is looked for).

    Reads headers, the tokenizer and a few sampled bytes of each file (their identities), no weights: the
    VAE and the text encoder load when the cache misses, the transformer at Init Trainer, streamed into its
    training placement (see `QwenImageComponents`). Block Linears are stored as `storage`; the VAE and text
    encoder run on `device`. `text_encoder_fp8` says what to do with a scaled-fp8 text encoder: "dequantize"
    while loading or "keep" its float8 weights (the cache keys name it); the Load settings' "auto" is decided
    before this by `planner.resolve_text_encoder_fp8`, and refused here. For Qwen-Image-Edit
    (families/qwen_image_edit/files.py): `vision` loads the encoder's vision tower, `extra_config` adds
    transformer config values no tensor tells. `family`: the family the caller (a loader of families/) says
    the files are.
    """
    check_fp8_mode(text_encoder_fp8)
    vocab_rows = check_files_fit(transformer, text_encoder, vae)
    tokenizer = load_tokenizer(tokenizer_dir, text_encoder, vocab_rows)
    device = torch.device(device)
    transformer_source = TransformerFile(transformer, storage, compute_dtype, extra_config)
    text_encoder_source = TextEncoderFile(text_encoder, compute_dtype, text_encoder_fp8, vision)
    vae_source = VaeFile(vae, compute_dtype)
    dtype = str(compute_dtype).removeprefix("torch.")
    identities = {
        "transformer": combined_identity(file_identity(transformer), repr(sorted((extra_config or {}).items()))),
        "vae": combined_identity(file_identity(vae), dtype),
        "text_encoder": combined_identity(file_identity(text_encoder), dtype, text_encoder_fp8, f"vision={vision}",
                                          hashlib.sha256(vocabulary_bytes(tokenizer)).hexdigest()),
    }

    def load_text_encoder():
        return text_encoder_source(components.text_encoder_placement), load_tokenizer(tokenizer_dir, text_encoder,
                                                                                       vocab_rows)

    components = QwenImageComponents(
        transformer=None, vae=None, text_encoder=None, tokenizer=None,
        scheduler_config=dict(QWEN_IMAGE_SCHEDULER_CONFIG), compute_dtype=compute_dtype, device=device, family=family,
        name=Path(transformer).stem, storage=storage, text_encoder_loader=load_text_encoder,
        vae_loader=vae_source, transformer_source=transformer_source, _fingerprints=identities,
    )
    return components
