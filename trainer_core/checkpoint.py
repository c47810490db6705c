"""Checkpoints of the whole training state, written atomically, read without unpickling anything.

One folder per run; inside it, one folder per checkpoint and a pointer to the newest:

    <run_dir>/checkpoints/step_000120/state.safetensors   every tensor (adapter, optimizer state, RNG states)
    <run_dir>/checkpoints/step_000120/state.json          everything else (step, data order, configs, losses)
    <run_dir>/checkpoints/latest.json                     {"dir": "step_000120", "step": 120}

A checkpoint folder is written under a temporary name, its files fsynced, then renamed into place, and
only then is `latest.json` replaced (also atomically). A crash or a full disk at any moment therefore
leaves the previous checkpoint complete and pointed to. The newest `KEEP` checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .files import write_bytes_atomic
from .finite import nonfinite_names

FORMAT_VERSION = 1
KEEP = 2
STATE_TENSORS = "state.safetensors"
STATE_JSON = "state.json"
LATEST = "latest.json"


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: str | Path, step: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    """Write one checkpoint and point `latest.json` at it; returns its folder."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final = root / name
    tmp = root / f".{name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp / STATE_TENSORS))
        (tmp / STATE_JSON).write_text(json.dumps({"format": FORMAT_VERSION, **meta}, indent=1))
        for f in (tmp / STATE_TENSORS, tmp / STATE_JSON):
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():  # the same step saved again (e.g. after an interrupt at a checkpoint step)
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    write_bytes_atomic(json.dumps({"dir": name, "step": step}).encode(), root / LATEST)
    _prune(root, step)
    return final


def _prune(root: Path, step: int) -> None:
    """Keep the newest KEEP checkpoints up to `step`; later ones belong to a discarded run and go too."""
    found = sorted((int(p.name.split("_")[1]), p) for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit())
    kept = [p for s, p in found if s <= step][-KEEP:]
    for _, folder in found:
        if folder not in kept:
            shutil.rmtree(folder, ignore_errors=True)


def clear(run_dir: str | Path) -> None:
    """Delete every checkpoint of a run (starting it over)."""
    shutil.rmtree(checkpoints_dir(run_dir), ignore_errors=True)


def _readable(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    try:
        meta = json.loads((folder / STATE_JSON).read_text())
        tensors = load_file(str(folder / STATE_TENSORS))
    except (OSError, ValueError, SafetensorError):
        return None
    return tensors, meta


def _unusable(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> str | None:
    """Why a readable checkpoint cannot be resumed (tensors missing, NaN/inf values), or None."""
    try:
        needed = [f"lora.{n}" for n in meta["param_names"]] + ["rng.trainer"]
        needed += _tensor_refs(meta["optimizer_state"])
        meta["step"], meta["lora"], meta["train"], meta["order"]  # noqa: B018 (the keys resume reads)
    except (KeyError, TypeError):
        return "its state.json lacks entries a checkpoint has"
    missing = [k for k in needed if k not in tensors]
    if missing:
        return f"it lacks {len(missing)} tensors (first: {missing[:2]})"
    bad = nonfinite_names(tensors)
    if bad:
        return f"{len(bad)} of its tensors hold NaN or inf values (first: {bad[:2]})"
    return None


def _tensor_refs(skeleton: Any) -> list[str]:
    if isinstance(skeleton, dict) and TENSOR_REF in skeleton:
        return [skeleton[TENSOR_REF]]
    if isinstance(skeleton, dict) and "__dict__" in skeleton:
        return [r for _, _, v in skeleton["__dict__"] for r in _tensor_refs(v)]
    if isinstance(skeleton, list):
        return [r for v in skeleton for r in _tensor_refs(v)]
    return []


def load_latest(run_dir: str | Path, notes: list[str] | None = None
                ) -> tuple[dict[str, torch.Tensor], dict[str, Any], Path] | None:
    """(tensors, meta, folder) of the newest complete checkpoint with finite values, or None when the run
    has none.

    Follows `latest.json`; if that is missing or its folder unreadable, incomplete or holding NaN/inf
    values, falls back to the newest usable `step_*` folder. Each checkpoint passed over for a reason
    other than a missing folder adds a sentence to `notes` (a list the caller shows to a person).
    """
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return None
    candidates = []
    try:
        name = json.loads((root / LATEST).read_text())["dir"]
        if isinstance(name, str) and name.startswith("step_") and Path(name).name == name:  # never outside root
            candidates.append(root / name)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    candidates += sorted((p for p in root.glob("step_*") if p.is_dir()), reverse=True)
    seen: set[Path] = set()
    for folder in candidates:
        if folder in seen:
            continue
        seen.add(folder)
        loaded = _readable(folder)
        if loaded is None:
            if folder.is_dir() and notes is not None:
                notes.append(f"checkpoint {folder} was skipped: it cannot be read (a damaged file).")
            continue
        reason = _unusable(*loaded)
        if reason is not None:
            if notes is not None:
                notes.append(f"checkpoint {folder} was skipped: {reason}.")
            continue
        return loaded[0], loaded[1], folder
    return None


# -- optimizer state <-> (tensors, JSON) ------------------------------------------------------------
# An optimizer's state_dict is nested dicts/lists of tensors and plain values (bitsandbytes nests its
# 8-bit quantisation state one level deeper). Tensors go to safetensors under their path; the
# structure goes to JSON with {"__tensor__": path} where each tensor was.

TENSOR_REF = "__tensor__"


def flatten_state(state: Any, prefix: str = "optim") -> tuple[dict[str, torch.Tensor], Any]:
    """Split a nested state into ({path: tensor}, JSON-able skeleton)."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(value: Any, path: str) -> Any:
        if torch.is_tensor(value):
            tensors[path] = value
            return {TENSOR_REF: path}
        if isinstance(value, dict):
            # JSON keys are strings: remember which were ints (torch keys param state by index).
            return {"__dict__": [[k, isinstance(k, int), walk(v, f"{path}/{k}")] for k, v in value.items()]}
        if isinstance(value, (list, tuple)):
            return [walk(v, f"{path}/{i}") for i, v in enumerate(value)]
        return value

    return tensors, walk(state, prefix)


def unflatten_state(tensors: dict[str, torch.Tensor], skeleton: Any) -> Any:
    def build(value: Any) -> Any:
        if isinstance(value, dict) and TENSOR_REF in value:
            return tensors[value[TENSOR_REF]]
        if isinstance(value, dict) and "__dict__" in value:
            return {(int(k) if was_int else k): build(v) for k, was_int, v in value["__dict__"]}
        if isinstance(value, list):
            return [build(v) for v in value]
        return value

    return build(skeleton)
