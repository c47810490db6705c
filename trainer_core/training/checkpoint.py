"""Checkpoints of the whole training state, written atomically, read without unpickling anything.

One folder per run; inside it, one folder per checkpoint and a pointer to the newest:

    <run_dir>/checkpoints/step_000120/state.safetensors   every tensor (adapter, optimizer state, EMA if on)
    <run_dir>/checkpoints/step_000120/state.json          everything else (format, step, micro-batch counter,
                                                          configs, losses)
    <run_dir>/checkpoints/latest.json                     {"dir": "step_000120", "step": 120}

A checkpoint folder is written under a temporary name, its files fsynced, then renamed into place, and
only then is `latest.json` replaced (also atomically). A crash or a full disk at any moment therefore
leaves the previous checkpoint complete and pointed to. The newest `KEEP` checkpoints are kept.

A checkpoint folder that goes (pruned, or replaced by the same step saved again) is first renamed to
`.step_N.old-PID`, so it disappears at once, never half-deleted under its real name. What a killed process
leaves (`.step_N.tmp-PID`, `.step_N.old-PID`, `.latest.json.PID.tmp`) is cleared by `remove_leftovers` when
the run folder is next opened.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..core import files
from ..core.errors import UserInputError
from ..core.files import save_safetensors, write_bytes_atomic
from ..core.finite import nonfinite_names

# 2: randomness derived from counters (training/randomness.py): the micro-batch counter replaces format 1's
# generator states and data-order position, which cannot be continued bit-exactly.
FORMAT_VERSION = 2
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
        save_safetensors(tensors, tmp / STATE_TENSORS)
        (tmp / STATE_JSON).write_text(json.dumps({"format": FORMAT_VERSION, **meta}, indent=1))
        for f in (tmp / STATE_TENSORS, tmp / STATE_JSON):
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        old = None
        if final.exists():  # the same step saved again (e.g. after an interrupt at a checkpoint step)
            old = _set_aside(final)
        try:
            os.replace(tmp, final)
        except OSError:
            if old is not None and not final.exists():
                os.replace(old, final)  # the earlier save of this step stays
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
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
            try:
                shutil.rmtree(_set_aside(folder), ignore_errors=True)
            except OSError:  # a read-only disk, say: an extra old checkpoint is harmless
                pass


def _set_aside(folder: Path) -> Path:
    """Rename a checkpoint folder out of the way (`.step_N.old-PID`) so it is gone at once; returns the new path."""
    aside = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    if aside.exists():
        shutil.rmtree(aside)
    os.replace(folder, aside)
    return aside


_TEMP_FOLDER = re.compile(r"^\.(?P<name>step_[0-9]+)\.(?P<kind>tmp|old)-[0-9]+$")


def remove_leftovers(run_dir: str | Path) -> list[Path]:
    """Clear what killed writes left in a run's checkpoints folder (call with the run folder locked): half-written
    `.step_N.tmp-PID` folders, `.step_N.old-PID` folders on their way out, `.latest.json.PID.tmp` files. A
    `.step_N.old-PID` that `latest.json` points to while `step_N` is missing (killed between the two renames of a
    re-saved step) is put back instead. Nothing else is touched; nothing is raised. Returns what was removed."""
    root = checkpoints_dir(run_dir)
    removed = files.remove_leftovers(root, names=re.escape(LATEST), any_pid=True)
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    try:
        pointed = json.loads((root / LATEST).read_text())["dir"]
    except (OSError, ValueError, KeyError, TypeError):
        pointed = None
    for entry in entries:
        match = _TEMP_FOLDER.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        try:
            if match.group("kind") == "old" and match.group("name") == pointed and not (root / pointed).exists():
                os.replace(path, root / match.group("name"))
                continue
            shutil.rmtree(path)
            removed.append(path)
        except OSError:
            pass
    return removed


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
        needed = [f"lora.{n}" for n in meta["param_names"]] + _tensor_refs(meta["optimizer_state"])
        needed += [f"ema.{n}" for n in meta["param_names"]] if meta.get("ema") else []  # training/ema.py
        meta["step"], meta["lora"], meta["train"], meta["micro_batches"]  # noqa: B018 (the keys resume reads)
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
        check_format(loaded[1], folder)
        reason = _unusable(*loaded)
        if reason is not None:
            if notes is not None:
                notes.append(f"checkpoint {folder} was skipped: {reason}.")
            continue
        return loaded[0], loaded[1], folder
    return None


def check_format(meta: dict[str, Any], folder: Path) -> None:
    """Refuse a checkpoint of another format (rather than pass over it and start the run again from step 0)."""
    found = meta.get("format")
    if found == FORMAT_VERSION:
        return
    raise UserInputError(
        f"checkpoint {folder} (step {meta.get('step', '?')}) is in checkpoint format {found}, written by an earlier "
        f"version of this pack; this version reads and writes format {FORMAT_VERSION} (training's random draws are "
        "now derived from counters, so the older format's generator states cannot continue the run bit-exactly). "
        "To keep what that run learned, start a new run_name with continue_from_lora set to a LoRA file saved from "
        f"it (Save LoRA or a snapshot); or delete {folder.parent} to start this run name again.")


# -- optimizer state <-> (tensors, JSON) ------------------------------------------------------------
# An optimizer's state_dict is nested dicts/lists of tensors and plain values (bitsandbytes nests its
# 8-bit quantisation state one level deeper). Tensors go to safetensors under their path; the
# structure goes to JSON with {"__tensor__": path} where each tensor was.

TENSOR_REF = "__tensor__"


def flatten_state(state: Any, prefix: str = "optim") -> tuple[dict[str, torch.Tensor], Any]:
    """Split a nested state into ({path: tensor}, JSON-able skeleton).

    A tensor that appears more than once (bitsandbytes' 8-bit optimizers put the same two quantisation maps
    into the state of every parameter of 4096 elements or more) is stored once and referenced from each
    place: safetensors refuses to write tensors that share memory, and the loaded state shares it again."""
    tensors: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}

    def walk(value: Any, path: str) -> Any:
        if torch.is_tensor(value):
            identity = (value.device, value.dtype, value.data_ptr(), value.storage_offset(), tuple(value.shape),
                        value.stride())
            if value.numel() and identity in seen:
                return {TENSOR_REF: seen[identity]}
            seen[identity] = path
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
