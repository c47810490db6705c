"""ComfyUI's int8 layers (format "int8_tensorwise", with or without a ConvRot rotation): what the file holds, and
the maths that reads it and computes with it. Nothing here touches a model.

Per quantised layer P (a Linear, or an Embedding's table), ComfyUI's file holds (comfy/ops.py; comfy-kitchen's
`TensorWiseINT8Layout`, which writes and reads it):
    P.comfy_quant   1-D uint8, UTF-8 JSON: {"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 256}
                    ("convrot" and "convrot_groupsize" may sit in a nested "params" object instead)
    P.weight        int8 (out, in): q, the (rotated) weight's rows quantised
    P.weight_scale  float32 (out, 1), one scale per row; a scalar for plain tensor-wise int8
    P.bias          floating point, as is
No rotation matrix and no input scale are stored. The rotation H of group g (a power of 4, 256 by default) is the
Kronecker power of one 4 x 4 block of +-1 over sqrt(g): symmetric and orthogonal (Hᵀ = H = H⁻¹), its entries
+-1/sqrt(g), a power of two, so every H is exact in any floating dtype. It acts on each group of g input features:
    W_rot = W Hᵀ,  scale = rowmax|W_rot| / 127,  q = round(W_rot / scale),  so  W = (q * scale) H
and a Linear computes, without ever forming W,
    y = x Wᵀ + b = (x H) (q * scale)ᵀ + b = ((x H) qᵀ) * scaleᵀ + b          x: (..., in), y: (..., out)
which is what the frozen compute path does (float8/storage.py `FrozenLinearFunction`: rotate the activations, upcast
q to their dtype, exact for |q| <= 128, multiply, scale the output rows; backward rotates the input's gradient back).

Why ours and not comfy-kitchen's at run time: the compute is our own autograd function (comfy-kitchen's
`int8_linear` is forward-only, and quantises the activations too), loading needs only the dequantisation's three
lines, and importing comfy-kitchen costs seconds and a 56 MB wheel for a headless user. The tests hold every function
here against comfy-kitchen's eager backend, bit for bit, on files its own quantiser wrote (tests/engine/test_int8_files.py).
"""

from __future__ import annotations

import functools
import json

import torch

INT8_FORMAT = "int8_tensorwise"
DEFAULT_GROUP = 256
_BLOCK = ((1, 1, 1, -1), (1, 1, -1, 1), (1, -1, 1, 1), (-1, 1, 1, 1))


def rotation_group(config: dict) -> int:
    """The rotation's group size of one layer's `comfy_quant` JSON (format int8_tensorwise): 0 = not rotated."""
    params = config.get("params") if isinstance(config.get("params"), dict) else {}
    if not config.get("convrot", params.get("convrot", False)):
        return 0
    group = int(config.get("convrot_groupsize", params.get("convrot_groupsize", DEFAULT_GROUP)))
    if not is_power_of_four(group):
        raise ValueError(f"a ConvRot group of {group} is not a power of 4")
    return group


def is_power_of_four(n: int) -> bool:
    return n >= 4 and n & (n - 1) == 0 and (n.bit_length() - 1) % 2 == 0


@functools.lru_cache(maxsize=16)
def _hadamard(group: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    h = block = torch.tensor(_BLOCK, dtype=torch.float32)
    while h.shape[0] < group:
        h = torch.kron(h, block)
    return (h / group ** 0.5).to(dtype=dtype, device=device)  # entries +-2^-k: exact in every dtype


def hadamard(group: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """H (group, group): the normalised regular Hadamard matrix ConvRot rotates with."""
    if not is_power_of_four(group):
        raise ValueError(f"a ConvRot group of {group} is not a power of 4")
    return _hadamard(group, dtype, torch.device(device))


def rotate(x: torch.Tensor, group: int) -> torch.Tensor:
    """x H on each group of `group` features of the last dimension: (..., K) -> (..., K), in x's dtype.

    H is symmetric, so this is also x Hᵀ: it rotates activations (forward) and input gradients (backward) alike."""
    *lead, features = x.shape
    h = hadamard(group, x.dtype, x.device)
    return (x.reshape(-1, features // group, group) @ h).reshape(*lead, features)


def _rotate_rows_back(w: torch.Tensor, group: int) -> torch.Tensor:
    """w Hᵀ on each group of the rows of a 2-D weight (out, in), as comfy-kitchen's weight rotation multiplies."""
    out, features = w.shape
    h = hadamard(group, w.dtype, w.device)
    return (w.reshape(out, features // group, group) @ h.T).reshape(out, features)


def dequantize(q: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """W in float32 (out, in) from q int8 (out, in), scale (out, 1) or (), and the rotation group (0: none)."""
    w = q.float() * scale.float()
    return _rotate_rows_back(w, group) if group else w


def quantize(weight: torch.Tensor, group: int = DEFAULT_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (out, in), scale float32 (out, 1)) of a weight (out, in), rotated first when `group`: what ComfyUI's
    int8 ConvRot files hold (for the writers of test and rehearsal files; the loaders never quantise)."""
    w = weight.float()
    if group:
        w = _rotate_rows_back(w, group)
    scale = (w.abs().amax(dim=-1, keepdim=True) / 127.0).clamp(min=1e-30)
    return (w / scale).round().clamp(-128.0, 127.0).to(torch.int8), scale


def comfy_quant_entry(group: int) -> torch.Tensor:
    """A layer's `comfy_quant` tensor as ComfyUI writes it: its JSON's UTF-8 bytes as 1-D uint8."""
    config = {"format": INT8_FORMAT, **({"convrot": True, "convrot_groupsize": group} if group else {})}
    return torch.tensor(list(json.dumps(config).encode()), dtype=torch.uint8)
