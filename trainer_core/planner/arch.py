"""Parameter counts the memory planner works from, read off a transformer's modules (no weights needed).

`real_arch()` builds the real Qwen-Image transformer on the meta device: the defaults of diffusers'
`QwenImageTransformer2DModel` are the real model's config (60 blocks, 24 heads x 128, joint dim 3584,
in 64, out 16); another family's real model is its own (`ModelFamily.planned_model`). `arch_from_transformer` reads
the same numbers from any instance (a tiny test model, a loaded model, a real one on the meta device), so the planner's
formulas can be checked against real tensors of a small model; what only the architecture knows (single-stream or
dual-stream blocks, its MLP's input Linear, its VAE's scale, its LoRA presets) it asks `models.architecture`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from torch import nn

from ..models.architecture import architecture_of
from ..models.qwen_arch import BLOCKS, QWEN25_VL_7B_CONFIG, split_block_module


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
    # One joint stream of prompt + target rows through every block Linear (single_stream.py), or dual-stream
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
    architecture = architecture_of(transformer)
    single = architecture.single_stream
    if single:  # one table of positive and negative positions (`freqs`), where the plan counts two halves
        table_rows = transformer.pos_embed.freqs[0].shape[0] // 2
    else:
        table_rows = pos_freqs.shape[0] if pos_freqs is not None else 4096
    heads, head_dim = cfg.num_attention_heads, cfg.attention_head_dim
    mlp = next(s for s in linears if s.name == architecture.mlp_input_linear)  # its output width is F
    # (a single-stream block's text width is its `context_in_dim`)
    return QwenImageArch(
        num_blocks=len(transformer.transformer_blocks),
        dim=heads * head_dim, mlp_dim=mlp.out_features, heads=heads, head_dim=head_dim,
        text_dim=cfg.get("joint_attention_dim") or cfg.get("context_in_dim"),
        latent_channels=cfg.in_channels // (cfg.patch_size ** 2), patch_size=cfg.patch_size,
        vae_scale_factor=vae_scale_factor or architecture.vae_scale_factor,
        rope_complex_per_token=sum(axes) // 2, rope_table_positions=table_rows,
        block_linears=tuple(linears), block_other_params=other, outside_params=outside,
        outside_largest_linear=max(m.weight.numel() for m in outside_linears),
        lora_targets={
            preset: tuple(split_block_module(n) for n in target_module_names(transformer, preset))
            for preset in architecture.lora_presets
        },
        single_stream=single,
    )


def arch_for_components(components) -> QwenImageArch:
    """The numbers of a loaded model set (`models.QwenImageComponents`), its VAE's scale factor included
    (read from the VAE's config when the VAE is there). Works while a trainer has the model."""
    return arch_from_transformer(components.skeleton(), vae_scale_factor=components.vae_scale_factor())


@functools.lru_cache(maxsize=1)
def real_arch() -> QwenImageArch:
    """The real Qwen-Image transformer's numbers, from a model built on the meta device (~0.3 s)."""
    from ..models.streaming import empty_transformer

    return arch_from_transformer(empty_transformer({}))


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
