"""LyCORIS adapters with peft: LoKr (Kronecker product) and LoHa (Hadamard product) on the transformer's Linears.

What each layer adds to its base Linear's output, W (out, in) its frozen weight, s = alpha / rank:
  LoKr  delta = s * kron(w1, w2)             w1 (a, c) and w2 (b, d) with a * b = out, c * d = in (peft's
        `factorization` of each side, `lokr_factor`); w2 is w2_a (b, r) @ w2_b (r, d) unless r >= max(b, d) / 2,
        w1 is w1_a (a, r) @ w1_b (r, c) with `lokr_decompose_both` unless r >= max(a, c) / 2.
  LoHa  delta = s * (w1_a @ w1_b) * (w2_a @ w2_b)   (elementwise), w*_a (out, r), w*_b (r, in).
Both start as an exact no-op: peft's own initialisation zeroes w1 (or w1_a) for LoKr and w2_b for LoHa. The
other tensors are drawn, as LoRA's A (`lora.inject_lora`), on the CPU from one generator seeded with the run's
seed, in model order, so the same seed gives the same adapter wherever the blocks' weights are.

Forward: peft's layers compute `base_layer(x) + x @ delta^T`. The base layer is called as it is, so the float8
paths and block streaming that replace the base Linears' forwards (models.float8, streaming) compute the frozen
part exactly as under LoRA. The layer's forward is ours (`_lycoris_forward`) for two reasons: peft's reads the
base weight's shape to reshape the delta, and a streamed block's modulation Linears hold an empty placeholder
there while their outputs come from a plan (streaming.modulation_outputs); and peft's draws `torch.rand(1)` for
module dropout on every training forward (0 = off still draws, and a draw of exactly 0.0 would skip the
adapter). The delta itself is peft's arithmetic (`make_kron`, `make_weight`), computed in the adapter's dtype
and cast to the activations' (as `lora.compute_in_input_dtype` does for LoRA's matrices).

Files: `file_tensors` writes ComfyUI's LyCORIS keys (comfy/weight_adapter/lokr.py, loha.py):
  diffusion_model.<module>.lokr_w1 | .lokr_w1_a/.lokr_w1_b, .lokr_w2 | .lokr_w2_a/.lokr_w2_b, .alpha
  diffusion_model.<module>.hada_w1_a, .hada_w1_b, .hada_w2_a, .hada_w2_b, .alpha
ComfyUI scales LoHa by alpha / rank as peft does, and LoKr by alpha / rank when w1 or w2 is decomposed, else by 1:
there peft's s is folded into w1 and no alpha is written, so every module's delta is peft's.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ..core.config import LoraConfig

ADAPTER = "default"
PARAMETER_PARTS = (".lokr_", ".hada_")  # in a LyCORIS parameter's name ('...to_q.lokr_w1.default')
LOKR_PARTS = ("lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b")
LOHA_PARTS = ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b")


def lycoris_layers(transformer: nn.Module) -> dict[str, nn.Module]:
    """Module name -> peft LoKr or LoHa layer, in model order."""
    from peft.tuners.lycoris_utils import LycorisLayer

    return {name: m for name, m in transformer.named_modules() if isinstance(m, LycorisLayer)}


def peft_config(cfg: LoraConfig, modules: list[str]):
    """peft's config for `cfg.adapter` (lokr or loha) on `modules`: no rank or module dropout (their draws come
    from the global generator), peft's no-op initialisation."""
    from peft import LoHaConfig, LoKrConfig

    common = dict(r=cfg.rank, alpha=cfg.alpha, rank_dropout=0.0, module_dropout=0.0, target_modules=list(modules),
                  init_weights=True)
    if cfg.adapter == "lokr":
        return LoKrConfig(decompose_both=cfg.lokr_decompose_both, decompose_factor=cfg.lokr_factor, **common)
    if cfg.adapter == "loha":
        return LoHaConfig(**common)
    raise ValueError(f"not a LyCORIS adapter: {cfg.adapter!r}")


def inject_lycoris(transformer: nn.Module, cfg: LoraConfig, modules: list[str], seed: int,
                   device: torch.device | str | None = None) -> None:
    """Add a LoKr or LoHa (cfg.adapter) to `modules` (full names), in cfg.dtype, each layer's tensors on `device`
    (default: beside its base layer's weight). Freezing the rest is the caller's (`lora.inject_lora`)."""
    from peft import inject_adapter_in_model

    inject_adapter_in_model(peft_config(cfg, modules), transformer, adapter_name=ADAPTER, low_cpu_mem_usage=True)
    dtype = getattr(torch, cfg.dtype)
    with torch.random.fork_rng(devices=[]):  # the CPU generator is restored afterwards; no device's is touched
        torch.default_generator.manual_seed(seed)
        for layer in lycoris_layers(transformer).values():
            home = device if device is not None else layer.get_base_layer().weight.device
            parts = _parts(layer)
            for name, p in parts.items():
                getattr(layer, name)[ADAPTER] = nn.Parameter(torch.empty(p.shape, dtype=dtype))
            layer.reset_adapter_parameters(ADAPTER)  # draws from the CPU generator: the tensors are there
            for name in parts:
                getattr(layer, name)[ADAPTER] = nn.Parameter(getattr(layer, name)[ADAPTER].data.to(home))
            layer.forward = functools.partial(_lycoris_forward, layer, True)


def _parts(layer: nn.Module) -> dict[str, torch.Tensor]:
    """The layer's adapter tensors by part name ('lokr_w1', 'hada_w2_b', ...), those it has."""
    names = LOKR_PARTS if hasattr(layer, "lokr_w1") else LOHA_PARTS
    return {n: getattr(layer, n)[ADAPTER] for n in names if ADAPTER in getattr(layer, n)}


def delta_weight(layer: nn.Module) -> torch.Tensor:
    """The layer's update (out, in), scaled, in the adapter's dtype: peft's `get_delta_weight` without reading
    the base weight (see the module docstring)."""
    scale = layer.scaling[ADAPTER]
    p = _parts(layer)
    if "hada_w1_a" in p:
        from peft.tuners.loha.layer import make_weight

        delta = make_weight(p["hada_w1_a"], p["hada_w1_b"], p["hada_w2_a"], p["hada_w2_b"], scale=torch.tensor(scale))
    else:
        from peft.tuners.lokr.layer import make_kron

        w1 = p["lokr_w1"] if "lokr_w1" in p else p["lokr_w1_a"] @ p["lokr_w1_b"]
        w2 = p["lokr_w2"] if "lokr_w2" in p else p["lokr_w2_a"] @ p["lokr_w2_b"]
        delta = make_kron(w1, w2, scale)
    return delta.reshape(layer.out_features, layer.in_features)


def _lycoris_forward(layer: nn.Module, in_input_dtype: bool, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    if layer.merged:  # the delta is inside the base weight (peft's own forward handles unmerging)
        return type(layer).forward(layer, x, *args, **kwargs)
    result = layer.base_layer(x, *args, **kwargs)
    if layer.disable_adapters or ADAPTER not in layer.active_adapters:
        return result
    delta = delta_weight(layer)
    if in_input_dtype or delta.dtype == x.dtype:  # the delta cast down, the input as it is
        return result + F.linear(x, delta if delta.dtype == x.dtype else delta.to(x.dtype))
    return result + F.linear(x.to(delta.dtype), delta).to(x.dtype)  # peft's way: the input cast up


def compute_in_input_dtype(transformer: nn.Module, enabled: bool = True) -> None:
    """The delta matmul in the activations' dtype (True, the trainer's) or in the adapter's (peft's cast)."""
    for layer in lycoris_layers(transformer).values():
        layer.forward = functools.partial(_lycoris_forward, layer, enabled)


def remove_forwards(transformer: nn.Module) -> None:
    for layer in lycoris_layers(transformer).values():
        layer.__dict__.pop("forward", None)


# --------------------------------------------------------------------------------------------------
# shapes (the memory planner) and files


def tensor_shapes(adapter: str, rank: int, in_features: int, out_features: int, factor: int = -1,
                  decompose_both: bool = False) -> list[tuple[int, int]]:
    """(rows, columns) of each adapter tensor of one Linear (in, out), as peft creates them."""
    if adapter == "lora":
        return [(rank, in_features), (out_features, rank)]
    if adapter == "loha":
        return [(out_features, rank), (rank, in_features)] * 2
    from peft.tuners.lokr.layer import factorization

    a, b = factorization(out_features, factor)  # out = a * b: w1 has a rows, w2 b rows
    c, d = factorization(in_features, factor)  # in = c * d
    shapes = [(a, rank), (rank, c)] if decompose_both and rank < max(a, c) / 2 else [(a, c)]
    shapes += [(b, rank), (rank, d)] if rank < max(b, d) / 2 else [(b, d)]
    return shapes


def file_tensors(transformer: nn.Module, alpha: float, dtype: torch.dtype, stem) -> dict[str, torch.Tensor]:
    """The adapter in ComfyUI's LyCORIS keys (module docstring) under `stem(module name)`, detached, on the CPU,
    in `dtype` (alpha fp32)."""
    out = {}
    for name, layer in lycoris_layers(transformer).items():
        parts = {k: v.detach().to("cpu", torch.float32) for k, v in _parts(layer).items()}
        stem_ = stem(name)
        if "lokr_w1" in parts and "lokr_w2" in parts:  # ComfyUI applies scale 1 here: peft's scale goes into w1
            parts["lokr_w1"] = parts["lokr_w1"] * layer.scaling[ADAPTER]
        else:
            out[f"{stem_}.alpha"] = torch.tensor(float(alpha), dtype=torch.float32)
        for part, tensor in parts.items():
            out[f"{stem_}.{part}"] = tensor.to(dtype).contiguous()
    return out
