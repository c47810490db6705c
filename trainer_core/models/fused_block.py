"""A Qwen-Image block's small work in few, fusable functions: our forward for diffusers' QwenImageTransformerBlock
and our processor for its joint attention, the same arithmetic with fewer kernels (issue 51, item 2).

diffusers runs, per block and stream, the QK RMSNorm as about seven tensor ops in fp32, RoPE as a complex multiply
in fp32 (reshape, view as complex, multiply, view as real, cast), and modulation, gates and residuals as separate
ops: ~170 kernels per block forward on a GPU, near the rate a CPU can issue them. Here the same arithmetic sits in
three functions over tensors, each a single graph for torch.compile (`dynamic=False`, `fullgraph=True`):
    joint_norm_rope(txt, img, ...)              QK RMSNorm then RoPE (real-valued, `norm_rope`) of both streams'
                                                query (or key), concatenated: one call per joint q / k tensor
    norm_modulate(x, shift, scale, eps)         LayerNorm (no affine) then x (1 + scale) + shift
    gated_residual(x, gate, y)                  x + gate y
and `gated_residual_norm_modulate` (the two above back to back, the block's middle). Every block calls the same
functions at the same shapes, so one compiled graph per shape serves all of them (no recompiles across blocks).
The Linears (peft's LoRA wrappers, the float8 storage, streamed weights, the runner's modulation wrappers) stay
outside: the block calls its modules as diffusers does.

Exactness (tests/engine/test_fused_block.py, diffusers' own block the oracle): eager, the functions do the ops
diffusers does in its order, except RoPE, (a c - b s, a s + b c) over real tables instead of a complex multiply,
the same products and sums (bit-identical here); compiled, Inductor may reorder a reduction (fp32 within ~1e-5 relative, measured 6e-6).

Modes (`FUSED_MODES`, `TrainConfig.fused_blocks`): auto (compiled on a CUDA GPU with Triton, else eager), eager,
compiled (where it can run; the CPU only with `allow_cpu`), off (diffusers' own forward). Installed by the
block runner (`streaming.runner.BlockRunner`) on Qwen-Image 1.x blocks (text-to-image, Edit, Layered); other
blocks (Qwen-Image 2.1's single stream) keep their own forward.

Shapes: B batch, S_img / S_txt tokens, D width (3072), H heads (24), Dh head size (128).
"""

from __future__ import annotations

import functools
import shutil
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import attention_backend

AUTO, EAGER, COMPILED, OFF = "auto", "eager", "compiled", "off"
FUSED_MODES = (AUTO, EAGER, COMPILED, OFF)
# Distinct shapes one run compiles each function at: img and txt streams, the modulation's (B, 1, D) and an
# Edit-2511 index's (B, L, D), times a few aspect buckets. Beyond it dynamo would fall back to eager silently.
RECOMPILE_LIMIT = 64


# ---------------------------------------------------------------------------------------------- the functions
def norm_rope(x: torch.Tensor, weight: torch.Tensor | None, eps: float, cos: torch.Tensor,
              sin: torch.Tensor) -> torch.Tensor:
    """x (B, S, H, Dh) -> RMSNorm over Dh with `weight` (Dh,), then RoPE with the tables (S, 1, Dh) of
    `rope_tables`: diffusers' RMSNorm then apply_rotary_emb_qwen(use_real=False), in one function.

    As diffusers: the variance in fp32, the normalised x cast to a half-precision weight's dtype before the
    weight multiplies; the rotation in fp32, cast back to the normalised dtype. The rotation of the pairs
    (a, b) = (x[2j], x[2j+1]) by (c, s) = (cos, sin) of position and j: (a c - b s, a s + b c), here
    x cos + swap(x) sin with swap(x)[2j] = x[2j+1], swap(x)[2j+1] = x[2j] and sin's even entries negated."""
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    y = x * torch.rsqrt(variance + eps)
    if weight is not None:
        if weight.dtype in (torch.float16, torch.bfloat16):
            y = y.to(weight.dtype)
        y = y * weight
    else:
        y = y.to(x.dtype)
    y32 = y.float()
    swapped = y32.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return (y32 * cos + swapped * sin).to(y.dtype)  # not addcmul: its fused multiply-add rounds otherwise


def joint_norm_rope(txt: torch.Tensor, img: torch.Tensor, txt_weight, img_weight, txt_eps: float, img_eps: float,
                    txt_cos, txt_sin, img_cos, img_sin) -> torch.Tensor:
    """The joint query (or key) (B, S_txt + S_img, H, Dh), text first as diffusers concatenates them: `norm_rope`
    of each stream then the concatenation, in one function (compiled, the concatenation is written in place by
    the norm's kernels instead of copied after them)."""
    return torch.cat([norm_rope(txt, txt_weight, txt_eps, txt_cos, txt_sin),
                      norm_rope(img, img_weight, img_eps, img_cos, img_sin)], dim=1)


def norm_modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """x (B, L, D) -> LayerNorm(x) (1 + scale) + shift; shift, scale (B, 1, D) or (B, L, D). diffusers' norm1 /
    norm2 (no affine) then `_modulate`."""
    return F.layer_norm(x, (x.shape[-1],), eps=eps) * (1 + scale) + shift


def gated_residual(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + gate y: x, y (B, L, D), gate (B, 1, D) or (B, L, D)."""
    return x + gate * y


def gated_residual_norm_modulate(x, gate, y, shift, scale, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's middle: the attention's gated residual, then norm2 and its modulation. (x', norm_modulate(x'))."""
    x = x + gate * y
    return x, F.layer_norm(x, (x.shape[-1],), eps=eps) * (1 + scale) + shift


@dataclass(frozen=True)
class Ops:
    """The functions as one mode runs them (eager: the functions above; compiled: each compiled once)."""

    mode: str
    joint_norm_rope: object
    norm_modulate: object
    gated_residual: object
    gated_residual_norm_modulate: object


EAGER_OPS = Ops(EAGER, joint_norm_rope, norm_modulate, gated_residual, gated_residual_norm_modulate)


@functools.cache
def compiled_ops() -> Ops:
    """The four functions compiled: static shapes (one graph per shape, shared by every block), one graph each
    (a break in these few lines would be a bug, so it fails loudly). The default mode: these are elementwise
    chains and one reduction, which Inductor fuses without autotuning; no CUDA graphs (the blocks' Linears and
    swapped weights change between calls, and the functions are small)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    compile_ = functools.partial(torch.compile, dynamic=False, fullgraph=True)
    return Ops(COMPILED, compile_(joint_norm_rope), compile_(norm_modulate), compile_(gated_residual),
               compile_(gated_residual_norm_modulate))


def compile_available(device: torch.device, allow_cpu: bool = False) -> bool:
    """torch.compile can run the functions here: Triton on a CUDA GPU; on the CPU Inductor's C++ backend, only
    with `allow_cpu` (tests, benchmarks: compiling costs seconds a shape and the CPU gains little)."""
    if device.type == "cpu":
        return allow_cpu and any(shutil.which(c) for c in ("g++", "c++", "clang++"))
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def ops_for(mode: str, device: torch.device, allow_cpu: bool = False) -> Ops | None:
    """The functions `mode` runs on `device`, None for diffusers' own block. auto: diffusers' block, until a GPU run
    has measured ours (benchmarks/gpu_profile.py): eager, ours is no faster on the CPU (benchmarks/op_count.py) and the
    planner's activation terms were measured on diffusers' block (ours keeps a little more for backward, so the plan
    would be short); compiled has never run on a card, so it is no default for users yet. eager: ours uncompiled;
    compiled: compiled where it can run (a CUDA GPU with Triton, the CPU with `allow_cpu`), else eager."""
    if mode not in FUSED_MODES:
        raise ValueError(f"fused_blocks={mode!r}: choose one of {', '.join(FUSED_MODES)}")
    if mode in (OFF, AUTO):
        return None
    if mode == COMPILED and compile_available(device, allow_cpu=allow_cpu):
        return compiled_ops()
    return EAGER_OPS


# ---------------------------------------------------------------------------------------------- RoPE tables
def rope_tables(freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """diffusers' complex frequencies (S, Dh / 2), e^{i theta} per position and pair, as the real tables
    `norm_rope` takes: cos (S, 1, Dh) = (c0, c0, c1, c1, ...), sin (S, 1, Dh) = (-s0, s0, -s1, s1, ...), fp32."""
    c, s = freqs.real.float(), freqs.imag.float()  # (S, Dh / 2)
    cos = torch.stack((c, c), dim=-1).flatten(-2)
    sin = torch.stack((-s, s), dim=-1).flatten(-2)
    return cos.unsqueeze(1), sin.unsqueeze(1)


class _TablesCache:
    """The tables of the last few frequency tensors. One forward hands every block the same tensors (and the
    checkpoint recompute them again), so the tables are made once per forward, not per block."""

    def __init__(self, size: int = 4):
        self.size = size
        self._entries: list[tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]] = []

    def get(self, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for held, tables in self._entries:
            if held is freqs:
                return tables
        tables = rope_tables(freqs)
        self._entries = [(freqs, tables), *self._entries[: self.size - 1]]
        return tables

    def clear(self) -> None:
        self._entries = []


# ---------------------------------------------------------------------------------------------- the processor
class FusedQwenAttnProcessor:
    """Joint attention of a Qwen-Image block with our functions and attention choice, in place of diffusers'
    QwenDoubleStreamAttnProcessor2_0 (the same inputs and outputs). One instance serves every block of a model,
    so the RoPE tables and the mask check are made once per forward."""

    def __init__(self, ops: Ops, backend: str = attention_backend.SDPA):
        self.ops = ops
        self.backend = backend
        self.tables = _TablesCache()
        self._mask_seen: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def joint_mask(self, text_mask: torch.Tensor | None, image_tokens: int) -> torch.Tensor | None:
        """(B, 1, 1, S_txt + S_img) boolean, diffusers' joint mask (text first, image all true), or None where
        no text token is padding (`attention_backend.drop_full_mask`), decided once per mask tensor."""
        if text_mask is None:
            return None
        if self._mask_seen is not None and self._mask_seen[0] is text_mask:
            return self._mask_seen[1]
        kept = attention_backend.drop_full_mask(text_mask)
        joint = None
        if kept is not None:
            image = torch.ones((kept.shape[0], image_tokens), dtype=torch.bool, device=kept.device)
            joint = torch.cat([kept.to(torch.bool), image], dim=1)[:, None, None, :]
        self._mask_seen = (text_mask, joint)
        return joint

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor = None,
                 encoder_hidden_states_mask: torch.Tensor = None, attention_mask: torch.Tensor | None = None,
                 image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None):
        """hidden_states (B, S_img, D), encoder_hidden_states (B, S_txt, D) -> (image out, text out)."""
        if encoder_hidden_states is None:
            raise ValueError("the fused Qwen-Image attention needs encoder_hidden_states (the text stream)")
        if attention_mask is not None:
            raise ValueError("the fused Qwen-Image attention builds its mask from encoder_hidden_states_mask")
        mask = self.joint_mask(encoder_hidden_states_mask, hidden_states.shape[1])
        seq_txt = encoder_hidden_states.shape[1]
        head_dim = attn.inner_dim // attn.heads
        heads = lambda t: t.unflatten(-1, (-1, head_dim))  # noqa: E731  (B, S, D) -> (B, S, H, Dh)
        img_q, img_k, img_v = heads(attn.to_q(hidden_states)), heads(attn.to_k(hidden_states)), heads(
            attn.to_v(hidden_states))
        txt_q, txt_k, txt_v = (heads(attn.add_q_proj(encoder_hidden_states)),
                               heads(attn.add_k_proj(encoder_hidden_states)),
                               heads(attn.add_v_proj(encoder_hidden_states)))
        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb
            img_cos, img_sin = self.tables.get(img_freqs)  # on the frequencies' device (the model's)
            txt_cos, txt_sin = self.tables.get(txt_freqs)
            rope = self.ops.joint_norm_rope
            query = rope(txt_q, img_q, attn.norm_added_q.weight, attn.norm_q.weight, attn.norm_added_q.eps,
                         attn.norm_q.eps, txt_cos, txt_sin, img_cos, img_sin)
            key = rope(txt_k, img_k, attn.norm_added_k.weight, attn.norm_k.weight, attn.norm_added_k.eps,
                       attn.norm_k.eps, txt_cos, txt_sin, img_cos, img_sin)
        else:  # no positions given: the norms alone (diffusers' modules)
            query = torch.cat([attn.norm_added_q(txt_q), attn.norm_q(img_q)], dim=1)
            key = torch.cat([attn.norm_added_k(txt_k), attn.norm_k(img_k)], dim=1)
        value = torch.cat([txt_v, img_v], dim=1)  # text first, as diffusers
        joint = attention_backend.attend(query, key, value, mask, self.backend)
        joint = joint.flatten(2, 3).to(query.dtype)  # (B, S, D)
        img_out = attn.to_out[0](joint[:, seq_txt:].contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)  # dropout
        txt_out = attn.to_add_out(joint[:, :seq_txt].contiguous())
        return img_out, txt_out


# ---------------------------------------------------------------------------------------------- the block
def _modulation(params: torch.Tensor, index: torch.Tensor | None) -> list[torch.Tensor]:
    """A block's modulation output (B, 6 D) -> [shift1, scale1, gate1, shift2, scale2, gate2], each (B, 1, D);
    with Edit-2511's `index` (B, L) on params (2 B, 6 D): each (B, L, D), the first half's rows where index is 0,
    the second half's elsewhere (diffusers' `_modulate`)."""
    parts = params.chunk(6, dim=-1)
    if index is None:
        return [p.unsqueeze(1) for p in parts]
    half = params.shape[0] // 2
    where = (index == 0).unsqueeze(-1)  # (B, L, 1)
    return [torch.where(where, p[:half].unsqueeze(1), p[half:].unsqueeze(1)) for p in parts]


def fused_block_forward(block, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                        encoder_hidden_states_mask: torch.Tensor | None, temb: torch.Tensor,
                        image_rotary_emb=None, joint_attention_kwargs: dict | None = None,
                        modulate_index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """QwenImageTransformerBlock.forward with the small work in `block.attn.processor.ops`: the same
    arguments, the same outputs (text (B, S_txt, D), image (B, S_img, D))."""
    ops = block.attn.processor.ops
    img_params = block.img_mod(temb)  # (B, 6 D): the modules as diffusers calls them (wrappers stay in)
    if block.zero_cond_t:
        temb = torch.chunk(temb, 2, dim=0)[0]
    txt_params = block.txt_mod(temb)
    img_shift1, img_scale1, img_gate1, img_shift2, img_scale2, img_gate2 = _modulation(img_params, modulate_index)
    txt_shift1, txt_scale1, txt_gate1, txt_shift2, txt_scale2, txt_gate2 = _modulation(txt_params, None)

    img_in = ops.norm_modulate(hidden_states, img_shift1, img_scale1, block.img_norm1.eps)
    txt_in = ops.norm_modulate(encoder_hidden_states, txt_shift1, txt_scale1, block.txt_norm1.eps)
    img_attn, txt_attn = block.attn(hidden_states=img_in, encoder_hidden_states=txt_in,
                                    encoder_hidden_states_mask=encoder_hidden_states_mask,
                                    image_rotary_emb=image_rotary_emb, **(joint_attention_kwargs or {}))

    hidden_states, img_in2 = ops.gated_residual_norm_modulate(
        hidden_states, img_gate1, img_attn, img_shift2, img_scale2, block.img_norm2.eps)
    hidden_states = ops.gated_residual(hidden_states, img_gate2, block.img_mlp(img_in2))
    encoder_hidden_states, txt_in2 = ops.gated_residual_norm_modulate(
        encoder_hidden_states, txt_gate1, txt_attn, txt_shift2, txt_scale2, block.txt_norm2.eps)
    encoder_hidden_states = ops.gated_residual(encoder_hidden_states, txt_gate2, block.txt_mlp(txt_in2))

    if encoder_hidden_states.dtype == torch.float16:  # diffusers' overflow clip for fp16
        encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
    if hidden_states.dtype == torch.float16:
        hidden_states = hidden_states.clip(-65504, 65504)
    return encoder_hidden_states, hidden_states


# ---------------------------------------------------------------------------------------------- installing
def fusable(block: nn.Module) -> bool:
    """A diffusers Qwen-Image 1.x block whose QK norms are diffusers' RMSNorm (what the functions reproduce)."""
    from diffusers.models.normalization import RMSNorm
    from diffusers.models.transformers.transformer_qwenimage import (
        QwenDoubleStreamAttnProcessor2_0,
        QwenImageTransformerBlock,
    )

    if type(block) is not QwenImageTransformerBlock:
        return False
    attn = block.attn
    norms = (attn.norm_q, attn.norm_k, attn.norm_added_q, attn.norm_added_k)
    return (isinstance(attn.processor, (QwenDoubleStreamAttnProcessor2_0, FusedQwenAttnProcessor))
            and all(type(n) is RMSNorm for n in norms))


@dataclass
class InstalledFused:
    """What `install` put on a model: the mode that runs (None: nothing installed), the attention choice, and
    the processors it replaced (to give back)."""

    mode: str | None
    attention: attention_backend.AttentionChoice
    previous: dict[nn.Module, object]

    @property
    def status(self) -> str:
        if self.mode is None:
            return "fused blocks: off (diffusers' own block and attention)"
        return f"fused blocks: {self.mode}; {self.attention.status}"

    def uninstall(self) -> None:
        for block, processor in self.previous.items():
            block.attn.set_processor(processor)
            if isinstance(block.__dict__.get("forward"), types.MethodType) and \
                    block.__dict__["forward"].__func__ is fused_block_forward:
                del block.__dict__["forward"]
        self.previous = {}


def install(blocks, mode: str, attention: attention_backend.AttentionChoice, device: torch.device,
            allow_cpu_compile: bool = False) -> InstalledFused:
    """Our processor (one for all blocks) and forward on every fusable block of `blocks`, running `mode`'s
    functions and `attention`'s backend. Nothing fusable, or mode off: the attention choice still applies where
    it can (our processor with diffusers' own block forward is not offered: off means diffusers' path)."""
    ops = ops_for(mode, device, allow_cpu=allow_cpu_compile)
    targets = [b for b in blocks if fusable(b)]
    if ops is None or not targets:
        return InstalledFused(None, attention, {})
    processor = FusedQwenAttnProcessor(ops, attention.backend)
    previous = {}
    for block in targets:
        previous[block] = block.attn.processor
        block.attn.set_processor(processor)
        block.forward = types.MethodType(fused_block_forward, block)
    return InstalledFused(ops.mode, attention, previous)
