"""What one frozen block Linear's call holds besides the weights and activations the plan counts: the weight's upcast
copy in the compute dtype (models/float8/storage.py), fp8 activations' quantised input (models/float8/activations.py),
an int8 ConvRot weight's rotated input (models/int8_convrot.py), int8 compute's rotated, quotient and int8 input copies and
its int32 and fp32 products (models/int8_compute.py). A call at a time: plan.py and phases.py take the
largest.
"""

from __future__ import annotations

from ..models.qwen_arch import IMG_STREAM, MODULATION_LINEARS

# Weight-sized transients of one frozen Linear call per storage, in weights of the compute dtype: the upcast copy, and
# for float8_scaled the scaled product (models/float8/storage.py `FrozenLinearFunction`). int8 ConvRot: the upcast
# copy; its rotated input is not alive at the training step's peak (tests/engine/test_int8_files.py measures the whole step:
# within 2% of float8's), so only a preview's forward counts it (phases.py, `rotation_input_bytes`).
UPCAST_COPIES = {"float8": 1, "float8_scaled": 2, "int8": 1, "bfloat16": 0}

# fp8 activations (models.float8.activations) quantise a Linear's input x: x / scale in fp32 (4 bytes per value)
# and its float8 copy (1), alive together for a moment.
FP8_QUANTISED_BYTES_PER_VALUE = 5


def fp8_input_bytes(arch, p, n_img: int) -> int:
    """The largest transient of fp8 activations: the biggest block Linear input (rows x in_features) quantised.
    0 when the option is off or the blocks are not stored in float8 (then the eager path runs)."""
    if not p.fp8_activations or p.storage not in ("float8", "float8_scaled"):
        return 0
    return FP8_QUANTISED_BYTES_PER_VALUE * largest_block_input(arch, p, n_img)


# int8 compute (models/int8_compute.py `quantize_activation`, `int8_linear`), per Linear call of M rows, K in, N out:
# quantising holds the rotated input (the compute dtype, when rotated), its fp32 quotient and the int8 copy at once
# (INT8_QUANTISED_BYTES_PER_VALUE + the dtype's bytes per input value); the product then holds the int8 input, the int32
# accumulator and its fp32 copy (INT8_PRODUCT_BYTES_PER_OUTPUT per output value) before the output is written. On CUDA a
# call of 16 rows or fewer is padded to INT8_PADDED_ROWS.
INT8_QUANTISED_BYTES_PER_VALUE = 5
INT8_PRODUCT_BYTES_PER_OUTPUT = 8
INT8_PADDED_ROWS = 32


def int8_compute_bytes(arch, p, n_img: int, act_bytes: int) -> int:
    """The largest transient of one int8 compute call (forward or recompute): the larger of its quantisation's and its
    product's (see above), over the block Linears. 0 when int8 compute is off."""
    if not getattr(p, "int8_compute", False):
        return 0
    largest = 0
    for s, rows in block_linear_rows(arch, p, n_img):
        if p.device == "cuda" and rows <= 16:
            rows = INT8_PADDED_ROWS
        quantise = rows * s.in_features * (INT8_QUANTISED_BYTES_PER_VALUE + act_bytes)
        product = rows * s.in_features + rows * s.out_features * INT8_PRODUCT_BYTES_PER_OUTPUT
        largest = max(largest, quantise, product)
    return largest


def rotation_input_bytes(arch, p, n_img: int, act_bytes: int) -> int:
    """int8 ConvRot blocks: the rotated copy of the biggest block Linear input (or of its input gradient), in the compute
    dtype (`act_bytes` a value), alive with the upcast weight. 0 for other storage."""
    return largest_block_input(arch, p, n_img) * act_bytes if p.storage == "int8" else 0


def largest_block_input(arch, p, n_img: int) -> int:
    """Values of the biggest input a block Linear takes in one call (rows x in_features)."""
    return max(rows * s.in_features for s, rows in block_linear_rows(arch, p, n_img))


def block_linear_rows(arch, p, n_img: int) -> list[tuple]:
    """(Linear shape, rows of one call) of every block Linear."""
    image_side = set(IMG_STREAM.values())
    out = []
    for s in arch.block_linears:
        if arch.single_stream:  # 2.1: every block Linear reads the joint sequence
            rows = p.batch * (n_img + p.text_tokens)
        elif s.name in MODULATION_LINEARS:
            rows = p.batch
        else:
            rows = p.batch * (n_img if s.name in image_side else p.text_tokens)
        out.append((s, rows))
    return out
