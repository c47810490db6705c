"""ComfyUI input specs built from the engine's config metadata, so tooltips and ranges match it."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..trainer_core.config import field_meta


def widget(cls: type, name: str, **override: Any) -> tuple:
    """(TYPE, options) for field `name` of config dataclass `cls`."""
    meta = field_meta(cls, name)
    default = next(f.default for f in dataclasses.fields(cls) if f.name == name)
    options: dict[str, Any] = {"default": default, "tooltip": meta["help"]}
    if "choices" in meta:
        options.update(override)
        return (list(meta["choices"]), options)
    for key in ("min", "max", "step"):
        if key in meta:
            options[key] = meta[key]
    options.update(override)
    if isinstance(default, bool):
        kind = "BOOLEAN"
    elif isinstance(default, int):
        kind = "INT"
    elif isinstance(default, float):
        kind = "FLOAT"
        options.setdefault("round", False)
    else:
        kind = "STRING"
    return (kind, options)


def widgets(cls: type, *names: str) -> dict[str, tuple]:
    return {name: widget(cls, name) for name in names}
