"""Run files written out: run-file tables as TOML text (the template `train --print-template` shows, a converted
diffusion-pipe config, tests' run files), in the order of run_file.TABLES."""

from __future__ import annotations

import json
import math
from typing import Any

from .run_file import TABLES


def toml_value(value: Any) -> str:
    """`value` (a string, number, bool or list of them) as TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        # JSON's string escapes are TOML basic-string escapes; TOML also wants DEL escaped.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def render(data: dict[str, Any], comments: dict[tuple, str] | None = None, header: str = "") -> str:
    """Run-file tables as TOML text, in the order of TABLES. `comments[(table, key)]` (for a dataset entry:
    `("dataset", index, key)`) is written after that key's value; `header` lines go first, as comments."""
    comments = comments or {}
    lines = [f"# {line}".rstrip() for line in header.splitlines()]

    def block(title: str, table: dict[str, Any], where: tuple) -> None:
        if lines:
            lines.append("")
        lines.append(title)
        for name, value in table.items():
            note = comments.get((*where, name))
            lines.append(f"{name} = {toml_value(value)}" + (f"  # {note}" if note else ""))

    for table in TABLES:
        if table not in data:
            continue
        if table == "dataset":
            for i, entry in enumerate(data[table]):
                block("[[dataset]]", entry, ("dataset", i))
        else:
            block(f"[{table}]", data[table], (table,))
    return "\n".join(lines) + "\n"
