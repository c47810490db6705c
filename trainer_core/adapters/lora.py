"""LoRA on the Qwen-Image transformer with peft: inject, remove, the adapter's parameters and weights.

Injection creates the adapter on the meta device and materialises it in the LoRA dtype: peft would
otherwise cast the adapter to the base layer's dtype, which is float8 here, and training would fail.

Which modules get a LoRA comes from the transformer's architecture (`models.architecture`: its presets, the last
block's dead modules). How the
adapter is written to and read from files, in every layout, is `lora_files.py`: this module knows
nothing of files. `LoraConfig.adapter` lokr or loha puts a LyCORIS adapter on the same modules instead
(`lycoris.py`); the functions here that are not about LoRA's A and B cover those too.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F
from torch import nn

from ..core.config import LoraConfig
from ..models.architecture import architecture_of
from ..models.qwen_arch import block_module
from . import lycoris

ADAPTER = "default"


def target_module_names(transformer: nn.Module, preset: str) -> list[str]:
    """Full module names ('transformer_blocks.3.attn.to_q', ...) that get a LoRA for `preset`."""
    last = len(transformer.transformer_blocks) - 1
    architecture = architecture_of(transformer)  # its block Linears and the last block's dead ones
    presets, dead = architecture.lora_presets, architecture.dead_in_last_block
    names = []
    for i in range(last + 1):
        for module in presets[preset]:
            if i == last and module in dead:
                continue
            names.append(block_module(i, module))
    return names


def matching_preset(transformer: nn.Module, modules: list[str]) -> str | None:
    """The target preset that adapts exactly `modules` in this transformer, if one does."""
    wanted = set(modules)
    presets = architecture_of(transformer).lora_presets
    return next((p for p in presets if set(target_module_names(transformer, p)) == wanted), None)


def lora_layers(transformer: nn.Module) -> dict[str, nn.Module]:
    """Module name -> peft LoRA layer, in model order."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in transformer.named_modules() if isinstance(m, LoraLayer)}


def inject_lora(transformer: nn.Module, cfg: LoraConfig, seed: int, modules: list[str] | None = None,
                device: torch.device | str | None = None) -> list[nn.Parameter]:
    """Add a LoRA (cfg.rank, cfg.alpha) to the preset's modules (or to `modules`, full names, when given);
    return its trainable parameters. Each layer's adapter lives on `device`, by default beside its base
    layer's weight.

    A is initialised like nn.Linear (Kaiming-uniform), B to zero, so the adapter starts as an exact no-op.
    Every A is drawn on the CPU from one generator seeded with `seed`, in model order, and then moved to its
    device: the same seed gives the same adapter whether a block's weights are on the GPU, on the CPU (a
    swapped block left there by an earlier run) or not loaded yet. Every other parameter is frozen.
    """
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    targets = list(modules) if modules is not None else target_module_names(transformer, cfg.targets)
    if cfg.adapter != "lora":
        lycoris.inject_lycoris(transformer, cfg, targets, seed, device)
        return _freeze_all_but_adapter(transformer)
    peft_cfg = PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets,
                              init_lora_weights=True)
    inject_adapter_in_model(peft_cfg, transformer, adapter_name=ADAPTER, low_cpu_mem_usage=True)
    dtype = getattr(torch, cfg.dtype)
    with torch.random.fork_rng(devices=[]):  # the CPU generator is restored afterwards; no device's is touched
        torch.default_generator.manual_seed(seed)
        for layer in lora_layers(transformer).values():
            home = device if device is not None else layer.get_base_layer().weight.device
            parts = (layer.lora_A[ADAPTER], layer.lora_B[ADAPTER])
            for part in parts:
                part.to_empty(device="cpu").to(dtype)
            layer.reset_lora_parameters(ADAPTER, True)  # draws from the CPU generator: the tensors are there
            for part in parts:
                part.to(home)
    return _freeze_all_but_adapter(transformer)


def _freeze_all_but_adapter(transformer: nn.Module) -> list[nn.Parameter]:
    for name, p in transformer.named_parameters():
        p.requires_grad_(is_adapter_parameter(name))
    return lora_parameters(transformer)


def is_adapter_parameter(name: str) -> bool:
    """Whether a parameter name ('...to_q.lora_A.default.weight', '...to_q.lokr_w1.default') is the adapter's."""
    return ".lora_" in name or any(part in name for part in lycoris.PARAMETER_PARTS)


def remove_lora(transformer: nn.Module) -> None:
    """Put every adapter layer's base layer back in its place: the model is as before `inject_lora`."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = {name: m for name, m in transformer.named_modules() if isinstance(m, BaseTunerLayer)}
    for name, layer in layers.items():
        parent_name, _, child = name.rpartition(".")
        setattr(transformer.get_submodule(parent_name), child, layer.get_base_layer())
    # peft leaves its config on the model; a later `inject_lora` would then warn of "multiple adapters".
    transformer.__dict__.pop("peft_config", None)


@contextlib.contextmanager
def adapter_disabled(transformer: nn.Module):
    """The transformer as the base model inside the block: every peft adapter layer (LoRA, and any other peft
    tuner layer) passes its input through its base layer alone (peft's own off-switch, `enable_adapters`). Which
    parameters need a gradient is put back as it was afterwards (peft's switch would otherwise decide it)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in transformer.modules() if isinstance(m, BaseTunerLayer)]
    wants_grad = [(p, p.requires_grad) for layer in layers for p in layer.parameters()]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield transformer
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for p, flag in wants_grad:
            p.requires_grad_(flag)


def lora_parameters(transformer: nn.Module) -> list[nn.Parameter]:
    """The adapter's trainable tensors (LoRA's A and B, or a LyCORIS adapter's parts), in model order."""
    return [p for name, p in transformer.named_parameters() if is_adapter_parameter(name)]


def adapter_weights(transformer: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Module name -> (A (rank, in), B (out, rank)), the live tensors."""
    return {
        name: (layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight)
        for name, layer in lora_layers(transformer).items()
    }


def compute_in_input_dtype(transformer: nn.Module, enabled: bool = True) -> None:
    """LoRA matmuls in the activations' dtype (bf16 on a GPU), the weights staying in theirs (fp32 masters).

    peft casts a LoRA layer's input up to the weights' dtype: with fp32 weights under bf16 compute every
    targeted Linear then makes an fp32 copy of its input, keeps it for backward and multiplies in fp32 (no
    tensor cores). Here the input stays as it is and the weights are cast down per call instead (r x in
    values); autograd casts their gradients back, so gradients, optimizer state and updates stay fp32 and a
    small update is not rounded away. Where the input already has the weights' dtype (fp32 compute on a CPU)
    nothing changes, bit for bit. `enabled=False` puts peft's behaviour back. A LyCORIS adapter casts its
    delta weight the same way (`lycoris.compute_in_input_dtype`)."""
    lycoris.compute_in_input_dtype(transformer, enabled)
    for layer in lora_layers(transformer).values():
        layer.cast_input_dtype_enabled = not enabled
        for part in (*layer.lora_A.values(), *layer.lora_B.values()):
            if enabled:
                part.forward = functools.partial(_linear_in_input_dtype, part)
            else:
                part.__dict__.pop("forward", None)


def _linear_in_input_dtype(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    weight = linear.weight if linear.weight.dtype == x.dtype else linear.weight.to(x.dtype)
    bias = linear.bias if linear.bias is None or linear.bias.dtype == x.dtype else linear.bias.to(x.dtype)
    return F.linear(x, weight, bias)
