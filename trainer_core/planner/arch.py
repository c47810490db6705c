"""Parameter counts the memory planner works from, read off a transformer's modules (no weights needed).

`real_arch()` builds the real Qwen-Image transformer on the meta device: the defaults of diffusers'
`QwenImageTransformer2DModel` are the real model's config (60 blocks, 24 heads x 128, joint dim 3584,
in 64, out 16); `real_arch21()` the same for Qwen-Image 2.1 (`QwenImage21Transformer2DModel`: 32 single-stream
blocks, 32 heads x 128, SwiGLU 3 x 4096, context 4096, 64 channels, patch 1). `arch_from_transformer` reads the same numbers from any instance (a tiny test model,
a loaded model), so the planner's formulas can be checked against real tensors of a small model.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

from torch import nn

from ..models.qwen21_arch import is_qwen_image21
from ..models.qwen_arch import BLOCKS, IMG_STREAM, LORA_TARGET_PRESETS, QWEN25_VL_7B_CONFIG, split_block_module


@dataclass(frozen=True)
class LinearShape:
    name: str  # module name inside one block, e.g. "attn.to_q"
    in_features: int
    out_features: int
    bias: bool


@dataclass(frozen=True)
class QwenImageArch:
    num_blocks: int
    dim: int  # D: width of both streams (heads x head_dim)
    mlp_dim: int  # F: hidden width of the feed-forwards (4 D)
    heads: int
    head_dim: int
    text_dim: int  # width of the prompt embeddings (joint_attention_dim)
    latent_channels: int  # VAE latent channels (in_channels / patch^2)
    patch_size: int
    vae_scale_factor: int  # pixels per latent cell along a side
    rope_complex_per_token: int  # complex64 RoPE factors per token (sum of axes / 2)
    rope_table_positions: int  # rows of the precomputed RoPE table (kept whole by the text stream's slice)
    block_linears: tuple[LinearShape, ...]  # the frozen Linears of one block (every block is the same)
    block_other_params: int  # one block's parameters outside its Linears (q/k RMSNorm weights)
    outside_params: int  # parameters outside the blocks (embedders, final norm, projection)
    outside_largest_linear: int  # parameters of the largest Linear weight outside the blocks
    lora_targets: dict[str, tuple[tuple[int, str], ...]]  # preset -> (block index, module name), model order
    # Qwen-Image 2.1: one joint stream of prompt + target rows through every block Linear (single_stream.py)
    single_stream: bool = False

    @property
    def block_linear_weight_params(self) -> int:
        return sum(s.in_features * s.out_features for s in self.block_linears)

    @property
    def block_linear_bias_params(self) -> int:
        return sum(s.out_features for s in self.block_linears if s.bias)

    @property
    def block_linear_rows(self) -> int:
        """Output rows of one block's Linears: the count of float8_scaled per-row scales."""
        return sum(s.out_features for s in self.block_linears)

    @property
    def block_params(self) -> int:
        return self.block_linear_weight_params + self.block_linear_bias_params + self.block_other_params

    @property
    def total_params(self) -> int:
        return self.num_blocks * self.block_params + self.outside_params

    @functools.cached_property
    def _linears_by_name(self) -> dict[str, LinearShape]:
        return {s.name: s for s in self.block_linears}

    @functools.cached_property
    def planner_memo(self) -> dict:
        """The planner's lists derived from this arch alone (plan._memo), kept with it: not fields, so an arch
        compares and copies as its numbers."""
        return {}

    def linear(self, module: str) -> LinearShape:
        # A dict, not a search of block_linears: the planner asks once per LoRA'd module of every block, for
        # every swap count it tries (the auto search plans hundreds of setups, ~2M lookups at 60 blocks).
        return self._linears_by_name[module]

    def image_tokens(self, width: int, height: int) -> int:
        """Packed latent tokens of one image of width x height pixels."""
        cell = self.vae_scale_factor * self.patch_size
        return (height // cell) * (width // cell)


def arch_from_transformer(transformer: nn.Module, vae_scale_factor: int | None = None) -> QwenImageArch:
    """Read the planner's numbers from a `QwenImageTransformer2DModel` (meta, CPU or GPU; with or without
    a LoRA injected). Parameter counts come from shapes only, so float8 storage does not change them."""
    from ..adapters.lora import is_adapter_parameter, target_module_names

    cfg = transformer.config
    block = transformer.transformer_blocks[0]
    linears = [  # a LoRA-wrapped Linear keeps its frozen layer as `<name>.base_layer`
        LinearShape(name.removesuffix(".base_layer"), m.in_features, m.out_features, m.bias is not None)
        for name, m in block.named_modules() if isinstance(m, nn.Linear) and "lora_" not in name
    ]
    linears.sort(key=lambda s: s.name)
    linear_param_names = {f"{s.name}.{leaf}" for s in linears for leaf in ("weight", "bias")}
    other = sum(
        p.numel() for n, p in block.named_parameters()
        if not is_adapter_parameter(n) and n.replace(".base_layer", "") not in linear_param_names
    )
    outside_linears = [
        m for n, m in transformer.named_modules()
        if isinstance(m, nn.Linear) and not n.startswith(BLOCKS)
    ]
    outside = sum(p.numel() for n, p in transformer.named_parameters() if not n.startswith(BLOCKS))
    axes = list(cfg.axes_dims_rope)
    pos_freqs = getattr(transformer.pos_embed, "pos_freqs", None)
    single = is_qwen_image21(transformer)
    if single:  # one table of positive and negative positions (`freqs`), where the plan counts two halves
        table_rows = transformer.pos_embed.freqs[0].shape[0] // 2
    else:
        table_rows = pos_freqs.shape[0] if pos_freqs is not None else 4096
    heads, head_dim = cfg.num_attention_heads, cfg.attention_head_dim
    # Qwen-Image 2.1 (single-stream): its SwiGLU's input projection, its text width `context_in_dim`
    mlp = next(s for s in linears if s.name in (IMG_STREAM["mlp0"], "img_mlp.proj"))
    return QwenImageArch(
        num_blocks=len(transformer.transformer_blocks),
        dim=heads * head_dim, mlp_dim=mlp.out_features, heads=heads, head_dim=head_dim,
        text_dim=cfg.get("joint_attention_dim") or cfg.get("context_in_dim"),
        latent_channels=cfg.in_channels // (cfg.patch_size ** 2), patch_size=cfg.patch_size,
        vae_scale_factor=vae_scale_factor or default_vae_scale_factor(single),
        rope_complex_per_token=sum(axes) // 2, rope_table_positions=table_rows,
        block_linears=tuple(linears), block_other_params=other, outside_params=outside,
        outside_largest_linear=max(m.weight.numel() for m in outside_linears),
        lora_targets={
            preset: tuple(split_block_module(n) for n in target_module_names(transformer, preset))
            for preset in LORA_TARGET_PRESETS
        },
        single_stream=single,
    )


def arch_for_components(components) -> QwenImageArch:
    """The numbers of a loaded model set (`models.QwenImageComponents`), its VAE's scale factor included
    (read from the VAE's config when the VAE is there). Works while a trainer has the model."""
    return arch_from_transformer(components.skeleton(), vae_scale_factor=components.vae_scale_factor())


def default_vae_scale_factor(qwen_image21: bool = False) -> int:
    """Pixels per latent cell of the real VAE: 2 ** len(temperal_downsample) of the installed diffusers'
    `AutoencoderKLQwenImage` defaults (the real config), read, not hard-coded; Qwen-Image 2.1's
    `AutoencoderKLQwenImage21` says it as its `scale_factor_spatial` default (16)."""
    if qwen_image21:
        from diffusers import AutoencoderKLQwenImage21

        return inspect.signature(AutoencoderKLQwenImage21.__init__).parameters["scale_factor_spatial"].default
    from diffusers import AutoencoderKLQwenImage

    default = inspect.signature(AutoencoderKLQwenImage.__init__).parameters["temperal_downsample"].default
    return 2 ** len(default)


@functools.lru_cache(maxsize=1)
def real_arch() -> QwenImageArch:
    """The real Qwen-Image transformer's numbers, from a model built on the meta device (~0.3 s)."""
    from ..models.streaming import empty_transformer

    return arch_from_transformer(empty_transformer({}))


@functools.lru_cache(maxsize=1)
def real_arch21() -> QwenImageArch:
    """The real Qwen-Image 2.1 transformer's numbers: diffusers' `QwenImage21Transformer2DModel` defaults are its
    config (32 blocks, 32 heads x 128, MLP ratio 3, context 4096, 64 channels, patch 1), built on the meta device."""
    import torch
    from diffusers import QwenImage21Transformer2DModel

    with torch.device("meta"):
        return arch_from_transformer(QwenImage21Transformer2DModel())


PLANNED_MODELS = ("qwen-image", "qwen-image-2.1")


def arch_for_model(model: str) -> QwenImageArch:
    """The real architecture the `plan` command plans for `model` (one of PLANNED_MODELS)."""
    return real_arch21() if model == "qwen-image-2.1" else real_arch()


@functools.lru_cache(maxsize=1)
def text_encoder_params() -> tuple[int, int]:
    """(parameters loaded, parameters of the decoder Linears) of Qwen2.5-VL-7B, the text encoder of Qwen-Image
    (`models.qwen_arch.QWEN25_VL_7B_CONFIG`), counted on the meta device.

    Loaded is the language model only, as `models.text_encoder_file` loads it: the vision tower is left
    out and `lm_head` replaced by an identity (7.07B of the file's 8.29B parameters). The decoder Linears
    are what a float8 text encoder file stores in float8; the embeddings stay in bf16.
    """
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**QWEN25_VL_7B_CONFIG))
    language_model = model.model.language_model
    total = sum(p.numel() for p in language_model.parameters())
    decoder_linears = sum(
        m.weight.numel() for n, m in language_model.named_modules() if isinstance(m, nn.Linear) and n.startswith("layers.")
    )
    return total, decoder_linears


@functools.lru_cache(maxsize=1)
def vae_params() -> int:
    """Parameters of the real Qwen-Image VAE (the installed diffusers' `AutoencoderKLQwenImage` defaults)."""
    import torch
    from diffusers import AutoencoderKLQwenImage

    with torch.device("meta"):
        return sum(p.numel() for p in AutoencoderKLQwenImage().parameters())
