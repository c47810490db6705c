"""Reading LoRA files of every layout back into rank, alpha and per-module (A, B) as trained (`read_lora_file`), and
into a live adapter (`check_targets`, `load_into_adapter`): the key conventions of lora_files.py, read.

A kohya file names modules with '_' for '.': they are read back against the model's own Linears (`kohya_names`). A
LoRA on a Linear ComfyUI's files fuse (2.1's MLP input projection) is read as the two LoRAs we train on its halves
(fused_mlp_lora.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from ..core.errors import UserInputError
from ..core.finite import nonfinite_names
from ..models.architecture import architecture_of
from ..models.qwen_arch import BLOCK_LINEARS, BLOCKS, OUTER_LINEARS
from .fused_mlp_lora import split_fused_pair
from .lora import ADAPTER, lora_layers
from .lora_files import (
    _KOHYA_BLOCK,
    _SUFFIXES,
    _UNSUPPORTED_PARTS,
    _UNSUPPORTED_SUFFIXES,
    B_SCALE_KEY,
    COMFY_PREFIX,
    DIFFUSERS_PREFIX,
    KOHYA_PREFIX,
    LoraFile,
)

def kohya_names(module_names, fused_linears=None) -> dict[str, str]:
    """kohya's spelling ('.' -> '_') -> module name, for the model's Linear `module_names` (and the fused names of
    its architecture's `fused_linears`, which ComfyUI's files hold: 2.1's MLP pair): what a kohya file of any family
    adapts. A spelling two modules share is left out (it names neither)."""
    names = set(module_names)
    for fused, halves in (fused_linears or {}).items():
        names |= {n[: -len(halves[0])] + fused for n in names if n.endswith(halves[0])}
    found: dict[str, list[str]] = {}
    for name in names:
        found.setdefault(name.replace(".", "_"), []).append(name)
    return {kohya: ours[0] for kohya, ours in found.items() if len(ours) == 1}


def _kohya_module(stem: str, names: dict[str, str] | None = None) -> str:
    """'transformer_blocks_3_attn_to_q' -> 'transformer_blocks.3.attn.to_q': by the model's own names (`kohya_names`)
    when given, else by Qwen-Image's Linears (unknown names stay as they are)."""
    if names:
        return names.get(stem, stem)
    if m := _KOHYA_BLOCK.fullmatch(stem):
        inner = {n.replace(".", "_"): n for n in BLOCK_LINEARS}.get(m.group(2))
        if inner:
            return f"{BLOCKS}.{m.group(1)}.{inner}"
    return {n.replace(".", "_"): n for n in OUTER_LINEARS}.get(stem, stem)


def _split_key(key: str, kohya: dict[str, str] | None = None) -> tuple[str, str, str] | None:
    """key -> (layout, module name, A|B|alpha); None for a key that is no LoRA part. `kohya`: `kohya_names`."""
    for suffix, part in _SUFFIXES.items():
        if key.endswith(suffix):
            stem = key[: -len(suffix)]
            break
    else:
        return None
    if stem.startswith(COMFY_PREFIX):
        return "comfyui", stem[len(COMFY_PREFIX):], part
    if stem.startswith(DIFFUSERS_PREFIX):
        return "diffusers", stem[len(DIFFUSERS_PREFIX):], part
    if stem.startswith(KOHYA_PREFIX):
        return "kohya", _kohya_module(stem[len(KOHYA_PREFIX):], kohya), part
    return "peft", stem.removeprefix("base_model.model."), part


def _metadata_number(path: Path, key: str, value) -> float:
    """A number from a file's metadata; a `UserInputError` naming the file and the entry when it is none."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise UserInputError(f"LoRA file {path} has metadata {key}={value!r}, which is not a number. Fix the "
                             "metadata or choose another LoRA file.") from None


def _metadata_alpha(path: Path, metadata: dict[str, str], rank: int) -> tuple[float, float]:
    """(alpha, B scale in the file) when the file has no `.alpha` keys."""
    if B_SCALE_KEY in metadata and "qwen_lora.alpha" in metadata:  # our diffusers layout
        return (_metadata_number(path, "qwen_lora.alpha", metadata["qwen_lora.alpha"]),
                _metadata_number(path, B_SCALE_KEY, metadata[B_SCALE_KEY]))
    if "lora_adapter_metadata" in metadata:  # diffusers' save_lora_weights: a peft config per component
        try:
            config = json.loads(metadata["lora_adapter_metadata"])
        except ValueError:
            config = None
        if not isinstance(config, dict):
            raise UserInputError(f"LoRA file {path} has metadata lora_adapter_metadata that is not a JSON object "
                                 f"({metadata['lora_adapter_metadata'][:80]!r}). Fix the metadata or choose another "
                                 "LoRA file.")
        for key in ("transformer.lora_alpha", "lora_alpha"):
            if config.get(key) is not None:
                return _metadata_number(path, f"lora_adapter_metadata {key}", config[key]), 1.0
    return float(rank), 1.0  # no alpha anywhere: every loader applies scale 1


def _file_alpha(path: Path, key: str, tensor: torch.Tensor) -> float:
    """The number an `.alpha` tensor holds: one element, a real number (an integer is fine), positive."""
    if tensor.numel() != 1 or tensor.dtype == torch.bool or tensor.is_complex():
        what = f"{tensor.numel()} elements" if tensor.numel() != 1 else f"dtype {tensor.dtype}"
        raise UserInputError(f"LoRA file {path}: {key} has {what} (shape {tuple(tensor.shape)}); an alpha is one "
                             "number. The file is damaged or not a LoRA: choose another LoRA file.")
    alpha = float(tensor.float())
    if not math.isfinite(alpha) or alpha <= 0:
        raise UserInputError(f"LoRA file {path}: {key} is {alpha}; alpha must be a positive finite number. The file "
                             "is damaged: choose another LoRA file (or a checkpoint of the same training).")
    return alpha


_PART_NAMES = {"A": "lora_A", "B": "lora_B", "alpha": "alpha"}
# A LoRA key ending so sets how ComfyUI runs its module (uint8 JSON; ComfyUI #16880, for turbo LoRAs): no LoRA tensor.
RUNTIME_CONFIG_SUFFIX = ".config"


def _first(names: list[str], n: int = 3) -> str:
    return f"{names[:n]}" + (f" and {len(names) - n} more" if len(names) > n else "")


def read_lora_file(path: str | Path, model: nn.Module | None = None) -> LoraFile:
    """Read a LoRA file (any layout above) into rank, alpha and per-module (A, B) as trained. `model`: the transformer
    (or its skeleton) it is for: kohya's names ('.' -> '_') are read back against its Linears (without it: Qwen-Image's),
    and a LoRA on a Linear its architecture's ComfyUI files fuse is read as the LoRAs on the halves we train.

    Refused, with a `UserInputError` naming the file and the problem: anything that is not a readable
    plain LoRA, non-floating-point weights (integer or bool tensors are no trained LoRA: a damaged file or
    another kind of file, and reading their values as weights would be silently wrong; float8, float16,
    bfloat16, float32 and float64 are read), NaN or inf anywhere, a module present twice (in two layouts),
    rank 0, and alphas that are not one positive finite number. Keys ending in `.config` (how ComfyUI should run a
    module: a turbo LoRA's attention) are no weights: named in `runtime_entries` and left out."""
    from safetensors import SafetensorError, safe_open

    path = Path(path).expanduser()
    if not path.is_file():
        where = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise UserInputError(f"LoRA file {path} {where}: choose an existing .safetensors LoRA.")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise UserInputError(f"LoRA file {path} is not a readable .safetensors file ({e}): it is damaged, cut short "
                             "or another format. Download or save it again, or choose another LoRA file.") from e
    unsupported = [k for k in tensors if k.endswith(_UNSUPPORTED_SUFFIXES) or any(u in k for u in _UNSUPPORTED_PARTS)]
    if unsupported:
        raise UserInputError(f"LoRA file {path} is not a plain LoRA (it has keys such as {unsupported[:3]}: DoRA, "
                             "LoHa, LoKr or LoCon). Only plain LoRAs can be continued.")
    parts: dict[str, dict[str, torch.Tensor]] = {}
    keys: dict[str, dict[str, str]] = {}  # module -> part -> key in the file
    layouts: set[str] = set()
    fused_linears = architecture_of(model).fused_linears if model is not None else {}
    kohya = kohya_names(linear_modules(model), fused_linears) if model is not None else None
    runtime = tuple(sorted(k for k in tensors if k.endswith(RUNTIME_CONFIG_SUFFIX)))
    for key, tensor in tensors.items():
        if key in runtime:  # how ComfyUI should run a module (a turbo LoRA's attention): not a weight
            continue
        split = _split_key(key, kohya)
        if split is None:
            raise UserInputError(f"LoRA file {path} has key {key}, which is no LoRA tensor (expected "
                                 "'<module>.lora_A.weight', '.lora_B.weight', '.lora_down/.lora_up.weight' or '.alpha').")
        layout, module, part = split
        if part in keys.get(module, {}):
            raise UserInputError(f"LoRA file {path} holds {module}'s {_PART_NAMES[part]} twice ({keys[module][part]} and "
                                 f"{key}): "
                                 "it mixes two LoRAs in different key layouts. Save each LoRA in its own file.")
        layouts.add(layout)
        parts.setdefault(module, {})[part] = tensor
        keys.setdefault(module, {})[part] = key
    if not parts:
        raise UserInputError(f"LoRA file {path} holds no LoRA tensors.")
    incomplete = [m for m, p in parts.items() if "A" not in p or "B" not in p]
    if incomplete:
        raise UserInputError(f"LoRA file {path} lacks lora_A or lora_B for {len(incomplete)} modules "
                             f"(first: {incomplete[:3]}).")
    not_float = [keys[m][x] for m, p in parts.items() for x in ("A", "B") if not p[x].is_floating_point()]
    if not_float:
        dtypes = sorted({str(tensors[k].dtype).removeprefix("torch.") for k in not_float})
        raise UserInputError(f"LoRA file {path} stores LoRA weights as {dtypes} (e.g. {_first(not_float)}): LoRA "
                             "weights are floating-point numbers, so the file is damaged or not a LoRA. Choose a "
                             "LoRA saved in float16, bfloat16 or float32.")
    bad = [m for m, p in parts.items() if p["A"].ndim != 2 or p["B"].ndim != 2 or p["B"].shape[1] != p["A"].shape[0]]
    if bad:
        shapes = {x: tuple(parts[bad[0]][x].shape) for x in ("A", "B")}
        raise UserInputError(f"LoRA file {path} has matrices that do not form a Linear LoRA for {bad[:3]} (first: "
                             f"lora_A {shapes['A']}, lora_B {shapes['B']}; a Linear LoRA has A (rank, in) and B "
                             "(out, rank)).")
    for module, fused_name in [(m, f) for m in parts for f in fused_linears if m.endswith("." + f)]:  # 2.1's MLP
        fused, fused_keys = parts.pop(module), keys.pop(module)
        for name, (a, b) in split_fused_pair(module, fused_name, fused_linears[fused_name], fused["A"], fused["B"],
                                             str(path)).items():
            parts[name] = {"A": a, "B": b, **({"alpha": fused["alpha"] / 2} if "alpha" in fused else {})}
            keys[name] = fused_keys
    ranks = {m: p["A"].shape[0] for m, p in parts.items()}
    if len(set(ranks.values())) > 1:
        by_rank: dict[int, list[str]] = {}
        for m, r in ranks.items():
            by_rank.setdefault(r, []).append(m)
        raise UserInputError(f"LoRA file {path} mixes ranks {sorted(by_rank)} (e.g. "
                             f"{ {r: ms[0] for r, ms in by_rank.items()} }); continuing needs one rank for all modules.")
    rank = next(iter(ranks.values()))
    if rank == 0:
        raise UserInputError(f"LoRA file {path} has rank 0 (its lora_A matrices have no rows): it holds no trained "
                             "weights. Choose another LoRA file (the LoRA Config's rank does not apply to a file).")
    nonfinite = nonfinite_names({keys[m][x]: p[x] for m, p in parts.items() for x in ("A", "B")})
    if nonfinite:
        raise UserInputError(f"LoRA file {path} holds NaN or inf values in {len(nonfinite)} tensors "
                             f"({_first(nonfinite)}): continuing from it would train nothing but NaN. Choose an "
                             "earlier LoRA file or checkpoint of that training.")
    alphas = {keys[m]["alpha"]: _file_alpha(path, keys[m]["alpha"], p["alpha"]) for m, p in parts.items() if "alpha" in p}
    if len(set(alphas.values())) > 1:
        raise UserInputError(f"LoRA file {path} has different alphas per module ({sorted(set(alphas.values()))[:5]}); "
                             "continuing needs one alpha for all modules.")
    without = [m for m, p in parts.items() if "alpha" not in p]
    if alphas and without and next(iter(alphas.values())) != rank:
        raise UserInputError(f"LoRA file {path} has .alpha keys for {len(alphas)} of {len(parts)} modules (first "
                             f"without: {without[:2]}): loaders scale the modules with one by alpha / rank = "
                             f"{next(iter(alphas.values())) / rank:g} and the others by 1; continuing needs one alpha "
                             "for all modules.")
    alpha, b_scale = (next(iter(alphas.values())), 1.0) if alphas else _metadata_alpha(path, metadata, rank)
    if not math.isfinite(alpha) or alpha <= 0 or not math.isfinite(b_scale) or b_scale == 0:
        raise UserInputError(f"LoRA file {path} has alpha {alpha} (B scale {b_scale}) in its metadata: both must be "
                             "positive finite numbers. Fix the metadata or choose another LoRA file.")
    weights = {m: (p["A"], p["B"] if b_scale == 1.0 else (p["B"].float() / b_scale)) for m, p in parts.items()}
    layout = sorted(layouts)[0] if len(layouts) == 1 else "mixed"
    return LoraFile(path=path, layout=layout, rank=rank, alpha=alpha, weights=weights, metadata=metadata,
                    runtime_entries=runtime)


def linear_modules(transformer: nn.Module) -> dict[str, nn.Linear]:
    """The model's own Linears (a LoRA's targets), by name."""
    return {n: m for n, m in transformer.named_modules() if isinstance(m, nn.Linear) and "lora_" not in n}


def check_targets(transformer: nn.Module, lora: LoraFile) -> None:
    """Every module the file adapts must be a Linear of `transformer` with the file's widths."""
    linears = linear_modules(transformer)
    absent = [m for m in lora.targets if m not in linears]
    if absent:
        raise UserInputError(
            f"LoRA file {lora.path} adapts {len(absent)} modules that this model does not have (first: {absent[:3]}). "
            "Choose a LoRA trained for this Qwen-Image model."
        )
    for module, (a, b) in lora.weights.items():
        linear = linears[module]
        if a.shape[1] != linear.in_features or b.shape[0] != linear.out_features:
            raise UserInputError(
                f"LoRA file {lora.path}: module {module} is {a.shape[1]} -> {b.shape[0]} wide in the file, "
                f"{linear.in_features} -> {linear.out_features} in the model. Choose a LoRA trained for this model."
            )


@torch.no_grad()
def load_into_adapter(transformer: nn.Module, weights: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy (A, B) per module into the injected adapter (cast to its dtype); the module sets must match."""
    layers = lora_layers(transformer)
    if set(layers) != set(weights):
        extra, missing = sorted(set(weights) - set(layers)), sorted(set(layers) - set(weights))
        raise UserInputError(f"the LoRA weights do not match the adapter: {len(extra)} modules without an adapter "
                             f"(first: {extra[:3]}), {len(missing)} adapter modules without weights (first: {missing[:3]}).")
    for name, (a, b) in weights.items():
        layer = layers[name]
        for target, source in ((layer.lora_A[ADAPTER].weight, a), (layer.lora_B[ADAPTER].weight, b)):
            if target.shape != source.shape:
                raise UserInputError(f"LoRA module {name}: shape {tuple(source.shape)} in the file, "
                                     f"{tuple(target.shape)} in the adapter.")
            target.copy_(source.to(target.device, target.dtype))


