"""Writing files so that a crash or a full disk never leaves a half-written file under the real name."""

from __future__ import annotations

import contextlib
import os
import unicodedata
from pathlib import Path

import torch
from safetensors.torch import save_file

from .errors import UserInputError
from .names import MAX_COMPONENT_BYTES, check_component, shown


def inside(root: str | Path, relative: str, what: str, example: str, suffix_room: int = 0) -> Path:
    """`root / relative`, refusing anything that would land outside `root` (absolute paths, '..', '~', a link
    to elsewhere) and any name that is not portable (see names.py): control characters, Windows' forbidden
    characters and reserved names, trailing dots or spaces, over-long names or paths. A backslash separates
    folders on every OS, and names are NFC-normalised (as macOS stores them). `suffix_room`: bytes the
    last name must leave free (a temporary file beside it adds a prefix and a suffix).

    `what` names the input in the error; `example` shows a valid value. Returns the real (resolved) path.
    """
    root = Path(root).resolve()
    text = unicodedata.normalize("NFC", relative.strip()).replace("\\", "/")
    candidate = Path(text)
    if not text or candidate.is_absolute() or text.startswith(("~", "/")) or ".." in candidate.parts:
        raise UserInputError(
            f"{what} {shown(relative)} must be a relative name inside {root} (no absolute path, no '..'), "
            f"for example {example!r}."
        )
    parts = candidate.parts
    for i, part in enumerate(parts):  # (a Windows drive 'C:' fails here: ':' is not allowed in a name)
        check_component(part, what, relative, MAX_COMPONENT_BYTES - (suffix_room if i == len(parts) - 1 else 0))
    path = root / candidate
    limit = _path_limit(root)
    size = len(os.fsencode(str(path))) + suffix_room
    if size > limit:
        raise UserInputError(
            f"{what}={shown(relative)} is too long: the path {str(path)[:60]}... is {size} bytes, over the {limit} "
            "bytes this system allows. Use shorter or fewer folder names."
        )
    real = path.resolve()
    if real != root and root not in real.parents:
        link = _first_link(root, parts)
        through = f" through the link {link} -> {os.readlink(link)}" if link is not None else ""
        raise UserInputError(
            f"{what} {shown(relative)} leads outside {root}{through}. Nothing is written outside it: remove the link, "
            "or choose another name."
        )
    return real


def _path_limit(root: Path) -> int:
    """The longest path (in bytes) this system opens: 259 characters on Windows without long paths, PATH_MAX
    (4096 with its NUL on Linux) elsewhere."""
    if os.name == "nt":  # pragma: no cover - Windows only
        return 259
    try:
        return int(os.pathconf(root if root.exists() else "/", "PC_PATH_MAX")) - 1
    except (OSError, ValueError):
        return 4095


def _first_link(root: Path, parts: tuple[str, ...]) -> Path | None:
    path = root
    for part in parts:
        path = path / part
        if path.is_symlink():
            return path
    return None


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
