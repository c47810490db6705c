"""Writing files so that a crash or a full disk never leaves a half-written file under the real name."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def _replacing(path: str | Path):
    """Yield a temporary path beside `path`; when the block succeeds, fsync it and rename it over `path`.

    On any failure (ENOSPC included) the temporary file is removed and an existing `path` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        # Writers may create the temporary file private (0600); give the result the usual permissions.
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_safetensors_atomic(tensors: dict[str, torch.Tensor], path: str | Path,
                             metadata: dict[str, str] | None = None) -> Path:
    """Write a safetensors file so that `path` is either the old file or the complete new one."""
    with _replacing(path) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    return Path(path)


def write_bytes_atomic(data: bytes, path: str | Path) -> Path:
    with _replacing(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)
