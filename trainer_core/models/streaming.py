"""Fill an empty (meta) model tensor by tensor, storing each tensor as it arrives.

A 20B transformer never exists twice in memory: each tensor is read, converted (float8 for block
Linears, compute dtype for the rest) and assigned before the next is read. `fill_empty` is the generic
part (names, shapes, missing and unknown tensors, error messages); `stream_into` adds the transformer's
storage rules. The text encoder and VAE loaders use `fill_empty` with their own rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from ..core.errors import UserInputError
from ..core.finite import has_nonfinite
from .float8 import SCALE_BUFFER, install_frozen_compute, is_one_byte, quantize_weight, set_rotation_group
from .int8_convrot import dequantize as dequantize_int8
from .qwen_arch import BLOCKS

# (module, leaf name, full name, tensor) -> None; stores `tensor` as `module.<leaf>`.
Assign = Callable[[nn.Module, str, str, torch.Tensor], None]
# name -> (tensor as stored, its float8 scale or None): tensors a loader takes instead of reading them (stream_into).
Given = dict[str, tuple[torch.Tensor, "torch.Tensor | None"]]


def empty_transformer(config: dict) -> nn.Module:
    """The transformer with parameters on the meta device (plain tensor attributes stay real)."""
    from accelerate import init_empty_weights
    from diffusers import QwenImageTransformer2DModel

    with init_empty_weights(include_buffers=False):
        return QwenImageTransformer2DModel.from_config(config)


def dequantize(tensor: torch.Tensor, scale: torch.Tensor | None, group: int = 0) -> torch.Tensor:
    """A scaled-fp8 or int8 tensor's real values in fp32, rotated back when its int8 is ConvRot-rotated with `group`
    (models/int8_convrot.py); the tensor itself when it has no scale."""
    if scale is None:
        return tensor
    if tensor.dtype == torch.int8:
        return dequantize_int8(tensor, scale, group)
    return tensor.float() * scale.float()


def assign_parameter(module: nn.Module, leaf: str, tensor: torch.Tensor) -> None:
    setattr(module, leaf, nn.Parameter(tensor, requires_grad=False))


def assign_frozen_linear_weight(linear: nn.Module, weight: torch.Tensor, scale: torch.Tensor | None,
                                rotation: int = 0) -> None:
    """Store `weight` as is (e.g. float8, int8) with an optional scale buffer and the ConvRot group of a rotated int8
    weight; compute through the eager path of float8/storage.py."""
    assign_parameter(linear, "weight", weight)
    if scale is not None:
        linear.register_buffer(SCALE_BUFFER, scale.float())
    set_rotation_group(linear, rotation)
    install_frozen_compute(linear)


@torch.no_grad()
def fill_empty(
    model: nn.Module,
    tensors: Iterable[tuple[str, torch.Tensor]],
    assign: Assign,
    source: str,
    hint: str,
    int8_ok: Iterable[str] = (),
) -> None:
    """Assign every (name, tensor) to the parameter of that name in `model`, through `assign`.

    Every parameter must arrive exactly once with the model's shape and finite values, in floating point unless it is
    among `int8_ok` (ComfyUI's int8 layers, whose scales the loader knows). Otherwise raise a `UserInputError`
    naming `source` and ending with `hint` (what to choose instead).
    """
    int8_ok = set(int8_ok)
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    seen: set[str] = set()
    unexpected: list[str] = []
    for name, tensor in tensors:
        if name not in expected:
            unexpected.append(name)
            continue
        if not tensor.is_floating_point() and not (tensor.dtype == torch.int8 and name in int8_ok):
            raise UserInputError(
                f"{source}: tensor {name} is stored as {str(tensor.dtype).removeprefix('torch.')}, not as "
                f"floating-point numbers: integer (e.g. int8-quantised) or bool weights cannot be read here. {hint}"
            )
        if tuple(tensor.shape) != expected[name]:
            raise UserInputError(
                f"{source}: tensor {name} has shape {tuple(tensor.shape)}, the model expects {expected[name]}. "
                f"{hint}"
            )
        if has_nonfinite(tensor):  # a base that computes NaN trains nothing: every step would be skipped
            raise UserInputError(
                f"{source}: tensor {name} holds NaN or inf values, so the model would compute nothing but NaN: the "
                f"file is damaged. Download or copy it again. {hint}"
            )
        module_name, _, leaf = name.rpartition(".")
        assign(model.get_submodule(module_name), leaf, name, tensor)
        seen.add(name)
    missing = sorted(set(expected) - seen)
    if missing or unexpected:
        detail = []
        if missing:
            detail.append(f"{len(missing)} missing (first: {missing[:3]})")
        if unexpected:
            detail.append(f"{len(unexpected)} unknown (first: {unexpected[:3]})")
        raise UserInputError(f"{source} does not match the model: {', '.join(detail)}. {hint}")


def _block_linear_names(model: nn.Module) -> set[str]:
    return {
        name for name, m in model.transformer_blocks.named_modules(prefix=BLOCKS)
        if isinstance(m, nn.Linear)
    }


def stream_into(
    model: nn.Module,
    tensors: Iterable[tuple[str, torch.Tensor]],
    storage: str,
    compute_dtype: torch.dtype,
    source: str,
    scales: dict[str, torch.Tensor] | None = None,
    device_for: Callable[[str], torch.device] | None = None,
    given: Given | None = None,
    int8: dict[str, int] | None = None,
) -> None:
    """Assign every (name, tensor) to the transformer; block Linear weights get `storage`, the rest
    `compute_dtype`. `device_for(name)` says where each stored tensor lives (default: where it was read,
    the CPU); a tensor moves there as soon as it is converted, so the host holds one tensor in flight.

    `scales` optionally maps a weight name to the scale it was stored with (ComfyUI's scaled-fp8 files:
    a per-tensor fp32 scalar; int8 layers: one per row), `int8` the int8 weights to their ConvRot group (0: not
    rotated; layouts.int8_weights). A block Linear weight that arrives in one byte (float8, int8) while `storage` is a
    float8 mode (one byte a weight) is kept exactly as stored, with its scale as the `weight_scale` buffer and its
    rotation: quantising it again could only lose precision. Anything else is dequantised and stored per `storage`.
    Raises a `UserInputError` naming `source` for unknown, missing or misshapen tensors.

    `given` maps names to (tensor, scale or None) already stored as this function would store them (the machine's
    shared host copy, `streaming.shared_host`): they are assigned as they are, with that scale, not converted again
    (the caller passes them in `tensors` instead of reading the file).
    """
    block_linears = _block_linear_names(model)
    scales = scales or {}
    given = given or {}
    int8 = int8 or {}

    def assign(module: nn.Module, leaf: str, name: str, tensor: torch.Tensor) -> None:
        scale = scales.get(name)
        module_name = name.rpartition(".")[0]
        home = device_for(name) if device_for is not None else tensor.device
        if name in given:  # stored already: only moved where it lives (the CPU, where the shared copy is)
            stored, stored_scale = given[name]
            if module_name in block_linears and leaf == "weight":
                assign_frozen_linear_weight(module, stored.to(home),
                                            None if stored_scale is None else stored_scale.to(home),
                                            int8.get(name, 0) if stored.dtype == torch.int8 else 0)
            else:
                assign_parameter(module, leaf, stored.to(home))
        elif module_name in block_linears and leaf == "weight":
            rotation = 0
            if is_one_byte(tensor) and storage.startswith("float8"):
                stored, stored_scale, rotation = tensor, scale, int8.get(name, 0)
            else:
                stored, stored_scale = quantize_weight(dequantize(tensor, scale, int8.get(name, 0)), storage)
            assign_frozen_linear_weight(module, stored.to(home),
                                        None if stored_scale is None else stored_scale.to(home), rotation)
        else:
            assign_parameter(module, leaf, dequantize(tensor, scale, int8.get(name, 0)).to(home, compute_dtype))

    fill_empty(model, tensors, assign, source,
               "Choose a Qwen-Image transformer file (for example qwen_image_fp8_e4m3fn.safetensors).", int8_ok=int8)
