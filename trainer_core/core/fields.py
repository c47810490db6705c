"""The machinery of the settings (config.py): a field with its help and range, reading a field's metadata,
checking a value against it, and the parsers of values with a syntax of their own (swap counts, colours,
run names). Imported by config.py, which re-exports what its users name."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any

from .errors import UserInputError
from .names import check_component

# blocks_to_swap = AUTO_SWAP asks the memory planner for the fewest swapped blocks that fit the device: a value of
# its own, which the engine turns into a count once (planner.for_run.plan_run). An INT widget or flag cannot hold
# a word, so there the user spells it AUTO_SWAP_NUMBER; parse_blocks_to_swap reads either spelling where a setting
# is made.
AUTO_SWAP = "auto"
AUTO_SWAP_NUMBER = -1
# gradient_checkpointing: 'auto' recomputes only as many blocks as the memory plan needs (every block on the CPU, without
# a known GPU budget, or when any block is swapped), 'on' every block, 'off' none. It was a true/false switch once.
CHECKPOINTING_CHOICES = ("auto", "on", "off")


def _f(default: Any, help: str, **meta: Any) -> Any:
    return field(default=default, metadata={"help": help, **meta})


def parse_blocks_to_swap(value: int | str) -> int | str:
    """'auto' (any case) or -1 -> AUTO_SWAP; a whole number (or its text) -> that number."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == AUTO_SWAP:
            return AUTO_SWAP
        try:
            value = int(text)
        except ValueError:
            raise UserInputError(
                f"blocks_to_swap={value!r} is not a number: use 'auto' (or -1), 0 for no swapping, or how many "
                "blocks to keep in CPU RAM."
            ) from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserInputError(f"blocks_to_swap={value!r} must be a whole number or 'auto'.")
    return AUTO_SWAP if value == AUTO_SWAP_NUMBER else value


def parse_checkpointing(value: bool | str) -> str:
    """gradient_checkpointing as one of CHECKPOINTING_CHOICES: 'auto', 'on' or 'off' (any case), or the true/false
    of run files and workflows saved while it was a switch (true -> 'on', false -> 'off')."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        text = value.strip().lower()
        text = {"true": "on", "false": "off"}.get(text, text)
        if text in CHECKPOINTING_CHOICES:
            return text
    raise UserInputError(f"gradient_checkpointing={value!r}: use 'auto' (recompute only as many blocks as memory "
                         "needs), 'on' (every block recomputes) or 'off' (none does).")


def parse_colour(text: str, what: str = "background") -> tuple[int, int, int]:
    """A colour name or #RRGGBB as an RGB tuple."""
    from PIL import ImageColor  # here, not at the top: this module stays free of heavy imports

    try:
        return ImageColor.getrgb(text.strip())[:3]
    except (ValueError, AttributeError):
        raise UserInputError(
            f"dataset {what}={text!r} is not a colour: use a name (white, black, gray, ...) or #RRGGBB."
        ) from None


def check_run_name(name: str) -> str:
    """A run name becomes a folder and a file name: keep it to one plain path component, portable to every OS."""
    import re

    if not name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._\- ]{0,99}", name) or ".." in name:
        raise UserInputError(
            f"run_name={name!r} is not a usable name: use letters, digits, '.', '_', '-' or spaces "
            "(up to 100 characters, no '..', no folders)."
        )
    check_component(name, "run_name", name)  # Windows' reserved names, a trailing dot or space
    return name


def config_field(cls: type, name: str) -> dataclasses.Field:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
    raise KeyError(f"{cls.__name__} has no setting {name!r}")


def help_text(cls: type, name: str) -> str:
    return config_field(cls, name).metadata["help"]


def field_meta(cls: type, name: str) -> dict[str, Any]:
    return dict(config_field(cls, name).metadata)


def field_default(cls: type, name: str) -> Any:
    return config_field(cls, name).default


def choices(cls: type, name: str) -> tuple:
    """The allowed values of a choice setting."""
    return tuple(config_field(cls, name).metadata["choices"])


def check_value(cls: type, name: str, value: Any) -> str | None:
    """Why `value` is not allowed for setting `name` of `cls` (its range, step or choices), or None if it is.
    The reason reads after the value, e.g. "must be from 1 to 512"."""
    meta = field_meta(cls, name)
    if "choices" in meta:
        return None if value in meta["choices"] else f"must be one of {', '.join(map(str, meta['choices']))}"
    if value in meta.get("words", ()):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    lo, hi, step = meta.get("min"), meta.get("max"), meta.get("step")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        return f"must be from {lo} to {hi}"
    if isinstance(value, int) and isinstance(step, int) and step > 1 and value % step:
        return f"must be a multiple of {step}"
    return None


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise UserInputError(f"{cls.__name__} got unknown settings {sorted(unknown)}.")
    return cls(**data)


def _check_range(cfg: Any, *names: str) -> None:
    for name in names:
        meta = field_meta(type(cfg), name)
        value = getattr(cfg, name)
        if value in meta.get("words", ()):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise UserInputError(f"{type(cfg).__name__}.{name}={value} must be a finite number.")
        lo, hi = meta.get("min"), meta.get("max")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise UserInputError(f"{type(cfg).__name__}.{name}={value} is outside its range [{lo}, {hi}].")


def _check_choice(cfg: Any, *names: str) -> None:
    for name in names:
        choices = field_meta(type(cfg), name)["choices"]
        if getattr(cfg, name) not in choices:
            raise UserInputError(
                f"{type(cfg).__name__}.{name}={getattr(cfg, name)!r} is not one of {list(choices)}."
            )
