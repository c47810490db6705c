"""Writing files so that a crash or a full disk never leaves a half-written file under the real name."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from .errors import UserInputError


def inside(root: str | Path, relative: str, what: str, example: str) -> Path:
    """`root / relative`, refusing anything that would land outside `root` (absolute paths, '..', '~').

    `what` names the input in the error; `example` shows a valid value.
    """
    root = Path(root).resolve()
    text = relative.strip()
    candidate = Path(text)
    if (not text or candidate.is_absolute() or text.startswith(("~", "/", "\\")) or ".." in candidate.parts
            or ".." in Path(text.replace("\\", "/")).parts):
        raise UserInputError(
            f"{what} {relative!r} must be a relative name inside {root} (no absolute path, no '..'), "
            f"for example {example!r}."
        )
    path = (root / candidate).resolve()
    if path != root and root not in path.parents:
        raise UserInputError(f"{what} {relative!r} resolves outside {root} (through a link?). Choose another name.")
    return path


def write_safetensors_atomic(tensors: dict[str, torch.Tensor], path: str | Path,
                             metadata: dict[str, str] | None = None) -> Path:
    """Write to a temporary name beside `path`, fsync, then rename over `path`.

    On any failure (ENOSPC included) the temporary file is removed and an existing `path` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_bytes_atomic(data: bytes, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
