"""The activation terms a LoKr or LoHa adds to a block (adapters.lycoris), on top of the LoRA formulas.

Both compute each layer's whole delta weight (out, in) in the adapter's dtype and multiply the input by it,
cast to the activations' dtype (`lycoris._lycoris_forward`). Read from that autograd graph (not measured):
- saved for backward, per targeted Linear: the delta as the matmul takes it, (out, in) in the compute dtype
  (the adapter's dtype with peft's cast); the small factors it is built from are the parameters themselves.
- transients, one layer at a time: forward the delta in the adapter's dtype beside its cast; backward the
  delta's gradient in the compute dtype and cast up, then the factor gradients' products (LoKr's Kronecker
  backward one (out, in) buffer, LoHa's Hadamard backward up to three: each product and their elementwise
  products with the gradient).
The LoRA formulas kept for these layers count a (rows, rank) output that a LyCORIS layer does not have: on
the safe side, and small beside the deltas. Parameter and optimizer-state counts are in plan.py
(`lora_tensor_shapes`, from peft's shapes).
"""

from __future__ import annotations

from .arch import QwenImageArch

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
# (out, in) buffers in the adapter's dtype alive in one layer's backward besides the cast gradient.
BACKWARD_BUFFERS = {"lokr": 2, "loha": 4}


def _block_targets(arch: QwenImageArch, targets: str) -> list[tuple[int, int]]:
    """(in, out) of the targeted Linears of a block that is not the last (the fullest set)."""
    return [(arch.linear(m).in_features, arch.linear(m).out_features) for b, m in arch.lora_targets[targets] if b == 0]


def _matmul_bytes(p) -> int:
    return DTYPE_BYTES[p.compute_dtype] if p.lora_in_compute_dtype else DTYPE_BYTES[p.lora_dtype]


def lycoris_saved_bytes(arch: QwenImageArch, p) -> int:
    """Delta weights one block saves for its backward (0 for a LoRA). `p`: the plan's PlanInputs."""
    if p.adapter == "lora":
        return 0
    return sum(fan_in * fan_out for fan_in, fan_out in _block_targets(arch, p.targets)) * _matmul_bytes(p)


def lycoris_working_bytes(arch: QwenImageArch, p) -> int:
    """The largest targeted layer's transient delta buffers (0 for a LoRA)."""
    if p.adapter == "lora":
        return 0
    largest = max(fan_in * fan_out for fan_in, fan_out in _block_targets(arch, p.targets))
    return largest * (_matmul_bytes(p) + BACKWARD_BUFFERS[p.adapter] * DTYPE_BYTES[p.lora_dtype])
