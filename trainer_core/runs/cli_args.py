"""The command line's argument types: flags made from the settings' metadata (`config_arg`), paths that must
exist or be writable, whole numbers of at least 1. Each bad value ends in argparse's one-line error naming the
flag (cli.py)."""

from __future__ import annotations

import argparse


def config_arg(cls: type, name: str, shown_default=None, **override) -> dict:
    """argparse keyword arguments for setting `name` of config dataclass `cls`: its help, default, choices,
    and a type that refuses values outside its range or step. `override` replaces any of them (a flag
    whose default differs from the canvas', or a help that says what the flag means in its command);
    `shown_default` is the default the help names when the command, not argparse, fills it in."""
    from ..core.config import check_value, field_default, field_meta

    meta = field_meta(cls, name)
    default = field_default(cls, name)
    kwargs: dict = {"default": default, "help": meta["help"]}
    if "choices" in meta:
        kwargs["choices"] = list(meta["choices"])
    elif isinstance(default, (int, float)) and not isinstance(default, bool):
        kwargs["type"] = _checked(cls, name, type(default), check_value)
        kwargs["metavar"] = "N" if isinstance(default, int) else "X"
    kwargs.update(override)
    shown = kwargs["default"] if shown_default is None else shown_default
    if shown is not None:
        kwargs["help"] = f"{kwargs['help']} (default: {shown})"
    kwargs["help"] = kwargs["help"].replace("%", "%%")
    return kwargs


def _checked(cls: type, name: str, kind: type, check_value, parse=None):
    def convert(text: str):
        try:
            value = parse(text) if parse is not None else kind(text)
        except ValueError as e:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(str(e) if parse is not None else f"{text!r} is not {what}") from None
        why = check_value(cls, name, value)
        if why is not None:
            raise argparse.ArgumentTypeError(f"{text} {why}")
        return value

    convert.__name__ = kind.__name__
    return convert


def blocks_to_swap_arg(**override) -> dict:
    """--blocks-to-swap: 'auto' or a number (config.parse_blocks_to_swap, which reads -1 as auto too), within
    TrainConfig's range; the flag's value is AUTO_SWAP or a count, its default too."""
    from ..core.config import TrainConfig, check_value, parse_blocks_to_swap

    kwargs = config_arg(TrainConfig, "blocks_to_swap", **override)  # a default of -1 means auto
    kwargs["default"] = parse_blocks_to_swap(kwargs["default"])
    kwargs["type"] = _checked(TrainConfig, "blocks_to_swap", int, check_value, parse=parse_blocks_to_swap)
    kwargs["metavar"] = "N|auto"
    return kwargs


def existing_path(kind: str):
    """An argparse type: a path that exists and is a `kind` ('file' or 'folder')."""
    from pathlib import Path

    def convert(text: str) -> str:
        path = Path(text).expanduser()
        ok = path.is_file() if kind == "file" else path.is_dir()
        if not ok:
            raise argparse.ArgumentTypeError(f"{text!r} is not an existing {kind}: check the path")
        return str(path)

    return convert


def check_writable_folder(folder: str, flag: str) -> None:
    """Make `folder` (and its parents) and write a probe file there, or say why not: before any work starts."""
    import tempfile
    from pathlib import Path

    from ..core.errors import UserInputError

    try:
        path = Path(folder).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise UserInputError(f"{flag} {folder}: cannot write there ({e.strerror or e}): choose a folder you can "
                             "write to.") from None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: at least 1")
    return value
