"""One-byte block Linears (float8; ComfyUI's int8, ConvRot-rotated or not): how their weights are stored, and the
paths that compute with them.

    storage.py      float8 / float8_scaled storage of the frozen block Linears, int8 weights kept as their file stores
                    them, and the eager compute path (`FrozenLinearFunction`: upcast per call, rotate the activations
                    of a ConvRot weight, nothing saved for backward but the module)
    activations.py  fp8 activations: float8 x float8 matmuls with torch._scaled_mm (TrainConfig.fp8_activations)
    compiled.py     the upcast compiled into the matmul (TrainConfig.compile_float8)
    paths.py        the one interface over the three and int8 compute (models/int8_compute.py):
                    compute_path(name).install(linears, device) -> Installed
"""

from .paths import COMPILED, EAGER, FP8_ACTIVATIONS, INT8, Installed, compute_path, path_name  # noqa: F401
from .storage import (  # noqa: F401  (the storage names every loader and writer uses)
    FLOAT8,
    FLOAT8_MAX,
    ROTATION_GROUP,
    SCALE_BUFFER,
    STORAGE_MODES,
    FrozenLinearFunction,
    block_linear_bytes,
    dequantized_state_dict,
    dequantized_weight,
    frozen_block_linears,
    frozen_linears,
    install_frozen_compute,
    is_one_byte,
    mark_weight_moves,
    quantize_per_tensor,
    quantize_weight,
    restore_forwards,
    rotation_group,
    set_rotation_group,
    store_block_linears,
)
