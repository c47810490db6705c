"""Activation memory of one Qwen-Image block in training: what autograd saves, and the working memory on top.

`block_saved_bytes` lists, tensor by tensor, what autograd keeps for the backward of one
`QwenImageTransformerBlock` (diffusers 0.42) with a peft LoRA (0.21) on some of its Linears and the frozen
Linears computed by `FrozenLinearFunction` (which saves nothing) or, for a weight already in the activations'
dtype, by plain `F.linear` (which saves a reference to the weight: no bytes of its own). It is exact: `tests/planner/test_memory.py`
compares it with `devtools.memprobe.SavedTensors` on real blocks, byte for byte. It assumes the block's
inputs require grad (true for every block but the first, whose inputs come from frozen embedders), so it
is an upper bound for block 0 by one LayerNorm input per stream.

Per stream (image: N = image tokens, text: N = text tokens), rows = batch x N, D = width, F = MLP width,
H = heads, a = activation bytes (bf16: 2), l = LoRA weight bytes, r = rank, sigma = LayerNorm statistic
bytes (fp32 on CUDA, the activation dtype on CPU):
    LayerNorm 1 and 2 inputs + mean/rstd        2 rows (D a + 2 sigma)
    (1 + scale) of both modulations              2 batch D a
    modulation parameters (gates are views)      batch 6 D a
    q and k RMSNorm: input, fp32 copy, rsqrt     2 rows (D a + 4 D + 4 H)
    GELU input                                   rows F a
    LoRA, per group of targets sharing an input  see `_lora_group`
    with a LoRA on the modulation (`all`):       4 rows D a (normed inputs and branch outputs the gates
                                                 multiply), plus the LoRA on silu(temb) (batch rows)
Joint attention (both streams' tokens): q, k, v, output + fp32 log-sum-exp   rows (4 D a + 4 H)

Peft casts a LoRA layer's input to the LoRA dtype before `lora_A`: with float32 LoRA weights under bf16
compute every targeted Linear keeps its own fp32 copy of its input (to_q, to_k and to_v three copies of
the same tensor). That is the largest single activation term at the default settings.

`WORKING_PER_TOKEN` is the rest of a block's peak (forward transients during the recompute, gradients
flowing through the block), measured, not derived: see its comment.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.qwen_arch import IMG_STREAM as IMG
from ..models.qwen_arch import LORA_TARGET_PRESETS
from ..models.qwen_arch import TXT_STREAM as TXT
from .arch import QwenImageArch

FP32 = 4


@dataclass(frozen=True)
class ActivationSettings:
    preset: str  # LoRA target preset (models.qwen_arch.LORA_TARGET_PRESETS)
    rank: int
    lora_bytes: int  # 4 for float32 LoRA weights, 2 for bfloat16
    dropout: bool  # LoRA dropout > 0
    act_bytes: int = 2  # bf16 compute
    cuda: bool = True  # two kernels differ by device, see `stats_bytes` and `mask_bytes`
    checkpointing: bool = True
    # The trainer computes the LoRA in the activations' dtype (`lora.compute_in_input_dtype`): its saved inputs
    # are then those of a LoRA in that dtype, plus each layer's weights cast down (r x (in + out) values).
    lora_in_compute_dtype: bool = False

    def as_computed(self) -> "ActivationSettings":
        """The settings whose formulas describe what is saved: a LoRA computed in the activations' dtype
        saves what a LoRA stored in it does."""
        if not self.lora_in_compute_dtype or self.lora_bytes == self.act_bytes:
            return self
        import dataclasses

        return dataclasses.replace(self, lora_bytes=self.act_bytes, lora_in_compute_dtype=False)

    @property
    def targets(self) -> frozenset[str]:
        """LoRA'd module names in a block (a block that is not the last: the fullest set)."""
        return frozenset(LORA_TARGET_PRESETS[self.preset])

    @property
    def stats_bytes(self) -> int:
        """LayerNorm's saved mean and rstd: fp32 on CUDA, the activation dtype on the CPU."""
        return FP32 if self.cuda else self.act_bytes

    @property
    def mask_bytes(self) -> int:
        """Dropout's saved mask per element: CUDA's fused kernel keeps a bool mask; the CPU path keeps the
        scaled noise tensor in the input's dtype (the LoRA dtype, after peft's cast)."""
        return 1 if self.cuda else self.lora_bytes


def _lora_group(s: ActivationSettings, rows: int, in_features: int, n_targets: int, shared: bool = False,
                input_grad: bool = True) -> int:
    """Bytes saved by `n_targets` LoRA layers that read the same (rows, in_features) input.

    lora_B saves lora_A's output (rows, r) in the LoRA dtype. lora_A saves its input: the input itself
    when no cast is needed (one tensor, shared by the group), else one cast copy per layer. With dropout,
    each layer saves its dropped input (LoRA dtype) and its mask (`mask_bytes` per element).
    `shared` says the uncast input is already counted elsewhere (no extra bytes for it). `input_grad`
    False (the modulation's input, computed from the timestep alone) means no gradient flows back through
    dropout, so its mask is not kept.
    """
    if n_targets == 0:
        return 0
    a_out = n_targets * rows * s.rank * s.lora_bytes
    if s.dropout:
        mask = s.mask_bytes if input_grad else 0
        return a_out + n_targets * rows * in_features * (s.lora_bytes + mask)
    if s.lora_bytes == s.act_bytes:
        return a_out + (0 if shared else rows * in_features * s.act_bytes)
    return a_out + n_targets * rows * in_features * s.lora_bytes


def _stream_saved(arch: QwenImageArch, s: ActivationSettings, batch: int, tokens: int, names: dict) -> int:
    D, F, H, a, sigma = arch.dim, arch.mlp_dim, arch.heads, s.act_bytes, s.stats_bytes
    rows = batch * tokens
    on = {key: names[key] in s.targets for key in names}
    total = 2 * rows * (D * a + 2 * sigma)  # LayerNorm 1 and 2: input, mean, rstd
    total += 2 * batch * D * a  # (1 + scale) of both modulations
    total += batch * 6 * D * a  # modulation parameters: the gates are views of it
    total += 2 * rows * (D * a + FP32 * D + FP32 * H)  # q, k RMSNorm: input, fp32 copy, rsqrt
    total += rows * F * a  # GELU input
    total += _lora_group(s, rows, D, on["q"] + on["k"] + on["v"])
    # The output projection reads its stream's slice of the attention output; with one sample that slice
    # is contiguous, `.contiguous()` returns it as is, and its storage is the attention output saved above.
    total += _lora_group(s, rows, D, on["out"], shared=batch == 1)
    total += _lora_group(s, rows, D, on["mlp0"])
    total += _lora_group(s, rows, F, on["mlp2"])
    if on["mod"]:  # shift/scale/gate now need grads: the tensors they multiply are saved
        total += 4 * rows * D * a
        total += _lora_group(s, batch, D, 1, input_grad=False)  # its input silu(temb): (batch, D)
    return total


def block_saved_bytes(arch: QwenImageArch, s: ActivationSettings, batch: int, n_img: int, n_txt: int) -> int:
    """Bytes autograd keeps for one block's backward (parameters and the shared RoPE table excluded)."""
    if arch.single_stream:  # Qwen-Image 2.1
        from . import single_stream

        return single_stream.block_saved_bytes(arch, s, batch, n_img, n_txt)
    weight_casts = 0
    if s.as_computed() is not s:
        lora = [arch.linear(m) for m in s.targets]
        weight_casts = sum(s.rank * (t.in_features + t.out_features) for t in lora) * s.act_bytes
        s = s.as_computed()
    joint = batch * (n_img + n_txt) * (4 * arch.dim * s.act_bytes + FP32 * arch.heads)  # attention q, k, v, out, lse
    return (_stream_saved(arch, s, batch, n_img, IMG) + _stream_saved(arch, s, batch, n_txt, TXT) + joint
            + weight_casts)


def block_input_bytes(arch: QwenImageArch, batch: int, n_img: int, n_txt: int, act_bytes: int = 2) -> int:
    """One block's inputs (image and text hidden states), what activation checkpointing keeps per block."""
    return batch * (n_img + n_txt) * arch.dim * act_bytes


# Working memory of one block in training: its peak of live bytes (the recompute's forward transients and
# the backward's gradients and temporaries) minus what it saves, in bytes per token of the longer stream
# per unit of MLP width F. Key: (targets preset, LoRA dtype, LoRA dropout > 0, checkpointing).
# Measured on the CPU, block Linears in bf16, rank 4, 4096 image + 256 text tokens (1024 x 1024):
#     .venv/bin/python tools/calibrate_activations.py --heads 4
# The ratio is width-independent (2, 4 and 8 heads agree to 0.1%), so it holds for the real 24 heads.
# At 1024 image + 64 text tokens the measured ratio is up to 5% higher (it is a maximum over phases of
# the backward, not one straight line); 5% of this term is under 0.5% of a 1024 x 1024 plan.
# With dropout the CPU keeps a mask in the LoRA dtype where CUDA keeps a bool: these entries are high for
# CUDA, on the safe side.
WORKING_PER_TOKEN = {
    ('attention', 'float32', False, True): 4.969,
    ('attention', 'float32', False, False): 4.437,
    ('attention', 'float32', True, True): 4.969,
    ('attention', 'float32', True, False): 4.437,
    ('attention', 'bfloat16', False, True): 4.437,
    ('attention', 'bfloat16', False, False): 3.906,
    ('attention', 'bfloat16', True, True): 4.969,
    ('attention', 'bfloat16', True, False): 4.437,
    ('attention+mlp', 'float32', False, True): 6.655,
    ('attention+mlp', 'float32', False, False): 6.124,
    ('attention+mlp', 'float32', True, True): 10.343,
    ('attention+mlp', 'float32', True, False): 9.811,
    ('attention+mlp', 'bfloat16', False, True): 3.721,
    ('attention+mlp', 'bfloat16', False, False): 3.721,
    ('attention+mlp', 'bfloat16', True, True): 5.656,
    ('attention+mlp', 'bfloat16', True, False): 5.124,
    ('all', 'float32', False, True): 4.53,
    ('all', 'float32', False, False): 3.999,
    ('all', 'float32', True, True): 8.218,
    ('all', 'float32', True, False): 7.686,
    ('all', 'bfloat16', False, True): 3.159,
    ('all', 'bfloat16', False, False): 3.159,
    ('all', 'bfloat16', True, True): 3.531,
    ('all', 'bfloat16', True, False): 2.999,
}


def block_working_bytes(arch: QwenImageArch, s: ActivationSettings, batch: int, n_img: int, n_txt: int) -> int:
    """A block's working memory on top of its saved activations (see `WORKING_PER_TOKEN`)."""
    if arch.single_stream:  # Qwen-Image 2.1: measured for its own block
        from . import single_stream

        return single_stream.block_working_bytes(arch, s, batch, n_img, n_txt)
    s = s.as_computed()
    ratio = WORKING_PER_TOKEN[(s.preset, "float32" if s.lora_bytes == 4 else "bfloat16", s.dropout, s.checkpointing)]
    return int(ratio * arch.mlp_dim * batch * max(n_img, n_txt))


def recomputed_blocks(p, num_blocks: int) -> int:
    """How many blocks recompute their activations in backward under `p` (a plan.PlanInputs): with checkpointing,
    `checkpointed_blocks` of them (None: all), else none."""
    if not p.checkpointing:
        return 0
    return num_blocks if p.checkpointed_blocks is None else min(p.checkpointed_blocks, num_blocks)
