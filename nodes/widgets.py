"""ComfyUI input specs built from the engine's config metadata, so tooltips, defaults and ranges match it.

Every widget of every node comes from a config field (trainer_core/core/config.py): its help is the tooltip,
its default, min/max/step and choices are the widget's. What only the host knows is filled in here: a
field with `file_list` metadata lists the files of that ComfyUI model folder (after its `extra_choices`),
with the field's default preselected when present (else the first). Only sockets (linked inputs) carry a
tooltip written in nodes/.
"""

from __future__ import annotations

from typing import Any

from ..trainer_core.core.config import field_default, field_meta
from . import host

# While widget_fields runs a node's INPUT_TYPES: (options, config class, field name) of each widget made.
_made: list[tuple[dict, type, str]] | None = None


def widget(cls: type, name: str) -> tuple:
    """(TYPE, options) for field `name` of config dataclass `cls`."""
    meta = field_meta(cls, name)
    default = field_default(cls, name)
    options: dict[str, Any] = {"default": default, "tooltip": meta["help"]}
    if _made is not None:
        _made.append((options, cls, name))
    if "file_list" in meta:
        extras, listed = list(meta.get("extra_choices", ())), host.model_file_list(meta["file_list"])
        files = [*extras, *listed]
        # the usual file when present, else the first file listed, else the first extra choice
        options["default"] = default if default in files else ([*listed, *extras] or [""])[0]
        return (files, options)
    if "folder_list" in meta:  # the input folder's subfolders (the only folder list so far)
        folders = [*meta.get("extra_choices", ()), *host.input_subfolders()]
        options["default"] = default if default in folders else folders[0]
        return (folders, options)
    if "choices" in meta:
        return (list(meta["choices"]), options)
    for key in ("min", "max", "step"):
        if key in meta:
            options[key] = meta[key]
    if isinstance(default, bool):
        kind = "BOOLEAN"
    elif isinstance(default, int):
        kind = "INT"
    elif isinstance(default, float):
        kind = "FLOAT"
        options["round"] = False  # keep values such as 1e-8 exact instead of rounding them to `step`
    else:
        kind = "STRING"
        if meta.get("multiline"):
            options["multiline"] = True
    return (kind, options)


def widgets(cls: type, *names: str, rename: dict[str, str] | None = None) -> dict[str, tuple]:
    """Widgets for fields `names` of `cls` (all its fields when none are named), in that order. `rename`
    maps a field name to the node's input name where they differ."""
    import dataclasses

    names = names or tuple(f.name for f in dataclasses.fields(cls))
    rename = rename or {}
    return {rename.get(name, name): widget(cls, name) for name in names}


def widget_fields(node_cls: type) -> dict[str, tuple[type, str]]:
    """The config field (class, name) each widget of node `node_cls` comes from, by input name (the generated
    references, tools/build_docs.py, read the settings from there rather than from the host's file lists)."""
    global _made
    _made = []
    try:
        spec = node_cls.INPUT_TYPES()
        made = {id(options): (cls, name) for options, cls, name in _made}
    finally:
        _made = None
    inputs = {**spec.get("required", {}), **spec.get("optional", {})}
    return {name: made[id(s[1])] for name, s in inputs.items() if len(s) > 1 and id(s[1]) in made}
