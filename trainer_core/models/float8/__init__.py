"""float8 block Linears: how their weights are stored (`storage`) and the paths that compute with them
(`activations`: float8 matmuls; `compiled`: the upcast compiled into the matmul)."""

from .storage import (  # noqa: F401  (the storage names every loader and writer uses)
    FLOAT8, FLOAT8_MAX, SCALE_BUFFER, STORAGE_MODES, FrozenLinearFunction, block_linear_bytes, dequantized_state_dict,
    dequantized_weight, frozen_block_linears, frozen_linears, install_frozen_compute, quantize_per_tensor,
    quantize_weight, restore_forwards, store_block_linears,
)
