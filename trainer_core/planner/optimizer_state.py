"""Bytes of optimizer state for the LoRA's tensors, per optimizer, as each library allocates it.

Each figure is held exactly to the bytes measured on the built optimizer (`optim.optimizer_state_bytes`)
by tests/engine/test_optimizers.py and tests/planner/test_memory.py. `shapes` are the LoRA tensors' (rows, columns): A is
(rank, in), B (out, rank); `param_bytes` the LoRA dtype's bytes per value.
"""

from __future__ import annotations

BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes keeps 32-bit state for smaller tensors (its `min_8bit_size`)
BNB_BLOCK = 256  # bitsandbytes' blockwise quantisation: one fp32 absmax per 256 values, per state
BNB_QMAP_BYTES = 2 * 256 * 4  # the two 256-entry fp32 quantisation maps, one pair per optimizer


def _adamw8bit(shapes, param_bytes: int) -> int:
    """Per tensor of >= 4096 values two uint8 states and two fp32 absmax vectors (one value per 256); smaller
    tensors two fp32 states; the two quantisation maps once per optimizer."""
    numels = [r * c for r, c in shapes]
    total = sum(2 * n + 2 * 4 * -(-n // BNB_BLOCK) if n >= BNB_MIN_8BIT_SIZE else 2 * 4 * n for n in numels)
    return total + (BNB_QMAP_BYTES if any(n >= BNB_MIN_8BIT_SIZE for n in numels) else 0)


def _per_value(states: int, extra: int = 0):
    """`states` tensors of the parameter's size and dtype, plus `extra` bytes per tensor."""
    return lambda shapes, pb: sum(states * r * c * pb + extra for r, c in shapes)


def _came(shapes, param_bytes: int) -> int:
    """exp_avg (full size), the row and column means of the squared gradient and of the residual (2 x rows +
    2 x columns) in float32 (CAME computes 16-bit weights' steps in float32), and a 0-d RMS of the weights in
    their own dtype."""
    return sum((r * c + 2 * r + 2 * c) * 4 + param_bytes for r, c in shapes)


def _adamw_kahan(shapes, param_bytes: int) -> int:
    """optimi: exp_avg and exp_avg_sq in the parameter's dtype; the Kahan compensation buffer only for 16-bit
    weights (its step count lives in the param group, not per tensor)."""
    return _per_value(3 if param_bytes < 4 else 2)(shapes, param_bytes)


def _automagic(shapes, param_bytes: int) -> int:
    """training/automagic.py: a float32 rate and a bool sign per value, float32 row and column means."""
    return sum(5 * r * c + 4 * (r + c) for r, c in shapes)


STATE_BYTES = {
    "adamw8bit": _adamw8bit,
    "adamw": _per_value(2, extra=4),  # exp_avg, exp_avg_sq; a 4-byte `step` tensor per parameter
    "adamw_kahan": _adamw_kahan,
    "prodigy": _per_value(4),  # exp_avg, exp_avg_sq, s and the starting weights p0 (flattened)
    "schedulefree_adamw": _per_value(2),  # z (the iterate) and exp_avg_sq; the weights hold y
    "came": _came,
    "automagic": _automagic,
}
# Temporaries of one optimizer step, in LoRA-sized buffers: foreach AdamW computes sqrt(v) into one; the
# others' elementwise steps are taken to need one too (an assumption on the safe side, not measured here);
# bitsandbytes' fused 8-bit kernel needs none.
STEP_TEMP_BUFFERS = {"adamw8bit": 0}


def optimizer_state_bytes(shapes: list[tuple[int, int]], optimizer: str, param_bytes: int) -> int:
    return STATE_BYTES[optimizer](shapes, param_bytes)


def optimizer_step_temp_bytes(lora_params: int, optimizer: str, param_bytes: int) -> int:
    return STEP_TEMP_BUFFERS.get(optimizer, 1) * lora_params * param_bytes
