"""Activation and working memory of one Qwen-Image 2.1 block: single-stream, so its own formulas, not the
dual-stream ones of activations.py (which dispatches here when `arch.single_stream`).

A 2.1 block (diffusers 0.42.1 `QwenImage21TransformerBlock`) runs the prompt's L rows and the target's N rows
through the same Linears: rows = batch x (L + N). D = width, F = 3 D (SwiGLU), H = heads, a = activation bytes,
sigma = LayerNorm statistic bytes (fp32 on CUDA, the activation dtype on the CPU), LoRA groups as activations.py
`_lora_group`. The block's modulation is a constant for its backward (the one shared `modulation` Linear outside
the blocks is frozen and gets no LoRA), so autograd saves only what the gradient of the hidden states needs:
    LayerNorm 1 and 2 inputs + mean/rstd                  2 rows (D a + 2 sigma)
    (1 + scale) of both modulations                       2 rows D a (per token: `torch.where` picks the t = 0
                                                          row for the text, the sample's row for the target)
    tanh(gate) of both                                    2 rows D a
    q and k RMSNorm: input, fp32 copy, rsqrt              2 rows (D a + 4 D + 4 H)
    q, k, v (after RoPE), attention outputs, fp32 lse     rows (4 D a + 4 H)
    the prompt segment's causal mask                      L^2 a (torch's SDPA turns the boolean mask additive)
    SwiGLU: the gate's output, its SiLU, the up output    3 rows F a
    LoRA: q/k/v on one input, out, gate/up on one input, down on the F-wide product
Exact against `devtools.memprobe.probe_block21` (SavedTensors) on real 2.1 blocks: tests/families/test_qwen_image21_plan.py.

Working memory (the recompute's transients and the backward's gradients on top of what is saved) and the
preview forward's are measured, per joint row and unit of F, by `tools/calibrate_qwen21.py`.
"""

from __future__ import annotations

from .activations import FP32, ActivationSettings, _lora_group
from .arch import QwenImageArch

ATTENTION_INPUT = ("attn.to_q", "attn.to_k", "attn.to_v")
MLP_INPUT = ("img_mlp.gate_layer", "img_mlp.proj")


def block_saved_bytes(arch: QwenImageArch, s: ActivationSettings, batch: int, n_img: int, n_txt: int) -> int:
    """Bytes autograd keeps for one 2.1 block's backward (parameters, modulation and RoPE factors excluded)."""
    targets = {module for _, module in arch.lora_targets[s.preset]}
    weight_casts = 0
    if s.as_computed() is not s:  # the LoRA computed in the activations' dtype: its weights cast down per call
        weight_casts = sum(s.rank * (arch.linear(m).in_features + arch.linear(m).out_features)
                           for m in targets) * s.act_bytes
        s = s.as_computed()
    D, F, H, a, sigma = arch.dim, arch.mlp_dim, arch.heads, s.act_bytes, s.stats_bytes
    rows = batch * (n_img + n_txt)
    total = 2 * rows * (D * a + 2 * sigma)  # LayerNorm 1 and 2
    total += 4 * rows * D * a  # (1 + scale) and tanh(gate), twice
    total += 2 * rows * (D * a + FP32 * D + FP32 * H)  # q, k RMSNorm
    total += rows * (4 * D * a + FP32 * H)  # attention q, k, v, outputs, log-sum-exp
    total += n_txt * n_txt * a  # the prompt segment's causal mask
    total += 3 * rows * F * a  # SwiGLU
    total += _lora_group(s, rows, D, len(targets & set(ATTENTION_INPUT)))
    total += _lora_group(s, rows, D, int("attn.to_out.0" in targets))
    total += _lora_group(s, rows, D, len(targets & set(MLP_INPUT)))
    total += _lora_group(s, rows, F, int("img_mlp.out" in targets))
    return total + weight_casts


# Working memory of a 2.1 block in training, bytes per joint row per unit of F; key (targets preset, LoRA dtype,
# dropout > 0, checkpointing). Measured on the CPU, Linears in bf16, rank 4, 64 x 64 target + 256 prompt rows:
#     OMP_NUM_THREADS=1 .venv/bin/python tools/calibrate_qwen21.py
# The ratio does not depend on the width (2 and 4 heads of 128 measure the same to 0.001), so it holds for the
# real 32 heads. 'all' is 'attention+mlp' in 2.1 (no modulation Linear in a block).
_MEASURED = {
    ('attention', 'float32', False, True): 6.0,
    ('attention', 'float32', False, False): 5.333,
    ('attention', 'float32', True, True): 6.0,
    ('attention', 'float32', True, False): 5.333,
    ('attention', 'bfloat16', False, True): 5.333,
    ('attention', 'bfloat16', False, False): 5.333,
    ('attention', 'bfloat16', True, True): 6.0,
    ('attention', 'bfloat16', True, False): 5.333,
    ('attention+mlp', 'float32', False, True): 8.667,
    ('attention+mlp', 'float32', False, False): 8.0,
    ('attention+mlp', 'float32', True, True): 12.667,
    ('attention+mlp', 'float32', True, False): 12.0,
    ('attention+mlp', 'bfloat16', False, True): 4.0,
    ('attention+mlp', 'bfloat16', False, False): 3.333,
    ('attention+mlp', 'bfloat16', True, True): 7.333,
    ('attention+mlp', 'bfloat16', True, False): 6.667,
}
WORKING_PER_ROW: dict[tuple[str, str, bool, bool], float] = {
    **_MEASURED, **{("all", *key[1:]): value for key, value in _MEASURED.items() if key[0] == "attention+mlp"}}

# A 2.1 block's forward without gradients (eval mode, LoRA on), bytes per joint row per unit of F; key (targets
# preset, LoRA dtype). Same tool, same sizes, the same at 2 and 4 heads.
_MEASURED_PREVIEW = {
    ('attention', 'float32'): 10.667,
    ('attention', 'bfloat16'): 10.667,
    ('attention+mlp', 'float32'): 18.0,
    ('attention+mlp', 'bfloat16'): 12.667,
}
PREVIEW_WORKING_PER_ROW: dict[tuple[str, str], float] = {
    **_MEASURED_PREVIEW,
    **{("all", key[1]): value for key, value in _MEASURED_PREVIEW.items() if key[0] == "attention+mlp"}}


def block_working_bytes(arch: QwenImageArch, s: ActivationSettings, batch: int, n_img: int, n_txt: int) -> int:
    s = s.as_computed()
    ratio = WORKING_PER_ROW[(s.preset, "float32" if s.lora_bytes == 4 else "bfloat16", s.dropout, s.checkpointing)]
    return int(ratio * arch.mlp_dim * batch * (n_img + n_txt))


def preview_block_working_bytes(arch: QwenImageArch, targets: str, lora_dtype: str, n_img: int, n_txt: int) -> int:
    return int(PREVIEW_WORKING_PER_ROW[(targets, lora_dtype)] * arch.mlp_dim * (n_img + n_txt))
