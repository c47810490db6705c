"""Writing files so that a crash or a full disk never leaves a half-written file under the real name."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import time
import unicodedata
from pathlib import Path

import torch
from safetensors import SafetensorError
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


def check_path_room(folder: str | Path, what: str, room: int) -> None:
    """Refuse a folder given as a full path (a run file's, a script's) whose names or length leave no room for
    the `room` bytes of the names written inside it: every write there would fail with a raw 'File name too
    long', after the work of computing what to write."""
    path = Path(folder).absolute()
    for part in path.parts[1:]:
        size = len(os.fsencode(part))
        if size > MAX_COMPONENT_BYTES:
            raise UserInputError(
                f"{what} {shown(str(path))} has a folder name of {size} bytes ({part[:24]!r}...), over the "
                f"{MAX_COMPONENT_BYTES} bytes a file or folder name may have. Choose a shorter folder name.")
    size, limit = len(os.fsencode(str(path))) + room, _path_limit(path)
    if size > limit:
        raise UserInputError(
            f"{what} {shown(str(path))} is too long: the files written inside it would have paths of {size} bytes, "
            f"over the {limit} bytes this system allows. Use shorter or fewer folder names.")


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


def temp_path(path: str | Path) -> Path:
    """Where `_replacing` writes `path` first: `.NAME.PID.tmp` beside it (`LEFTOVER` recognises it)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


# A temporary file or folder of `_replacing` left by a killed process: `.NAME.PID.tmp`.
LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<pid>[0-9]+)\.tmp$")
# safetensors' own temporary file (the Rust `tempfile` crate's `.tmpXXXXXX`): `save_file` writes one beside its
# target and renames it over the target at the end, so a killed save leaves one. Ours are made inside a folder
# of our own (`_replacing(..., private_folder=True)`); bare ones are only cleared where nobody else writes.
LIBRARY_TEMP = re.compile(r"^\.tmp[A-Za-z0-9]{6}$")


@contextlib.contextmanager
def _replacing(path: str | Path, private_folder: bool = False):
    """Yield a temporary path beside `path`; when the block succeeds, fsync it and rename it over `path`.

    On any failure (ENOSPC included) the temporary file is removed and an existing `path` is untouched.
    `private_folder`: the temporary path lies in a folder `.NAME.PID.tmp` of its own, for a library writer
    that makes temporary files of its own beside the file it writes (safetensors does): a killed write then
    leaves only that folder, which `remove_leftovers` recognises by its name.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = temp_path(path)
    if private_folder:
        if scratch.exists():
            shutil.rmtree(scratch) if scratch.is_dir() else scratch.unlink()
        scratch.mkdir()
    tmp = scratch / path.name if private_folder else scratch
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        # Writers may create the temporary file private (0600); give the result the usual permissions.
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):  # a read-only or vanished folder: nothing more to clean
            if scratch.is_dir() and not scratch.is_symlink():
                shutil.rmtree(scratch)
            elif scratch.exists():
                scratch.unlink()


def os_error(e: BaseException) -> OSError | None:
    """The operating system's error behind a library's: `e` itself, or the one a `SafetensorError` names in its
    message ("I/O error: No space left on device (os error 28)"); None when there is none."""
    if isinstance(e, OSError):
        return e
    match = re.search(r"\(os error (\d+)\)", str(e)) if isinstance(e, SafetensorError) else None
    if match is None:
        return None
    code = int(match.group(1))
    return OSError(code, os.strerror(code))


def save_safetensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors' `save_file`, raising an `OSError` (with its errno and the path) where the library raises
    its own `SafetensorError` for a failed write (full disk, quota, permissions, read-only disk)."""
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path), metadata=metadata)
    except SafetensorError as e:
        error = os_error(e)
        if error is None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from e


def write_safetensors_atomic(tensors: dict[str, torch.Tensor], path: str | Path,
                             metadata: dict[str, str] | None = None) -> Path:
    """Write a safetensors file so that `path` is either the old file or the complete new one."""
    with _replacing(path, private_folder=True) as tmp:
        save_safetensors(tensors, tmp, metadata)
    return Path(path)


def write_bytes_atomic(data: bytes, path: str | Path) -> Path:
    with _replacing(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_error(e: OSError, what: str, where: str | Path, kept: str) -> UserInputError:
    """The documented message for a write that failed with `e` (README, Troubleshooting): what could not be
    written where, what is kept (`kept`), and what to do. `e` may be a library's error (`os_error`)."""
    e = os_error(e) or e
    code = getattr(e, "errno", None)
    kept = f"{kept} " if kept else ""
    if code == errno.ENOSPC:
        return UserInputError(f"the disk is full: the {what} could not be written to {where}. {kept}"
                              "Free some space and run again.")
    if code == getattr(errno, "EDQUOT", 122):  # Linux value where the platform has none
        return UserInputError(f"the disk quota is used up: the {what} could not be written to {where}. {kept}"
                              "Free some space or ask for a larger quota, and run again.")
    if code == errno.EFBIG:
        return UserInputError(f"the file is too large: the {what} could not be written to {where} (the disk's or "
                              f"the process's file size limit, `ulimit -f`). {kept}Raise the limit or choose a "
                              "folder on another disk.")
    if code in (errno.EACCES, errno.EPERM):
        return UserInputError(f"no permission to write: the {what} could not be written to {where}. {kept}Make the "
                              "folder writable for the user that runs ComfyUI (or this script), or choose another "
                              "folder.")
    if code == errno.EROFS:
        return UserInputError(f"the disk is read-only: the {what} could not be written to {where}. {kept}Choose a "
                              "folder on a writable disk, or mount it read-write.")
    if code == errno.ENAMETOOLONG:
        return UserInputError(f"the path is too long: the {what} could not be written to {where} (a name over "
                              f"{MAX_COMPONENT_BYTES} bytes, or a path over the system's limit). {kept}Use shorter "
                              "or fewer folder names.")
    if code in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        blocker = f" ({e.filename})" if getattr(e, "filename", None) else ""
        return UserInputError(f"a file is in the way: the {what} could not be written to {where}, because a file "
                              f"stands where a folder must be, or a folder where a file must be{blocker}. {kept}"
                              "Move or rename it, or choose another folder.")
    return UserInputError(f"the {what} could not be written to {where} ({getattr(e, 'strerror', None) or e}). {kept}"
                          .rstrip())


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process writes nothing while it clears its folders
    if os.name == "nt":  # pragma: no cover - Windows only (os.kill(pid, 0) would end the process there)
        import ctypes

        kernel32 = ctypes.windll.kernel32
        handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return kernel32.GetLastError() != 87  # ERROR_INVALID_PARAMETER: no such process; else assume alive
        code = ctypes.c_ulong()
        try:
            return not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)) or code.value == 259  # STILL_ACTIVE
        finally:
            kernel32.CloseHandle(handle)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def remove_leftovers(folder: str | Path, names: str = r".+", any_pid: bool = False,
                     library_temps_older_than: float | None = None) -> list[Path]:
    """Delete what `_replacing` leaves when its process is killed mid-write, `.NAME.PID.tmp` (a file, or a folder
    holding the library's own temporary file), NAME matching the regular expression `names`, from `folder` (not
    its subfolders); returns what was removed.

    Only entries of exactly that form go, and only when process PID is gone (`any_pid`: whatever the PID, for a
    folder this process holds locked). `library_temps_older_than` (seconds): also bare `.tmpXXXXXX` files of
    safetensors untouched for that long, for a folder only we write to (earlier versions left those). Anything
    else, a user's `notes.tmp` say, is never touched. Never raises: leftovers that cannot be removed (a read-only
    disk) stay for another time."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        try:
            match = LEFTOVER.match(entry.name)
            if match is not None and re.fullmatch(names, match.group("name")):
                if not any_pid and _pid_alive(int(match.group("pid"))):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    os.unlink(entry.path)
                else:
                    continue
            elif (library_temps_older_than is not None and LIBRARY_TEMP.match(entry.name)
                    and entry.is_file(follow_symlinks=False)
                    and now - entry.stat(follow_symlinks=False).st_mtime > library_temps_older_than):
                os.unlink(entry.path)
            else:
                continue
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed
