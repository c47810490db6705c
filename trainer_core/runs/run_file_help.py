"""`train --help-config`: every table and key of a run file (run_file.py) with its help, allowed values and
default, as a commented TOML template."""

from __future__ import annotations

import textwrap
from typing import Any

from ..core.config import NO_LORA, InitConfig, TrainConfig, field_meta
from .run_file import KEYS, SOURCE_NAMES, TABLES, Key
from .run_file_toml import toml_value

OPT_IN_TABLES = ("edit",)  # [edit] makes the run a Qwen-Image-Edit one


def help_config(width: int = 100) -> str:
    """Every table and key with its help, allowed values and default, as a commented TOML template."""
    out = [
        "# Run file of `python -m trainer_core train --config FILE` (TOML): every setting, with its help and default.",
        "# Leave a setting out to take its default. Relative paths are relative to this file's folder.",
    ]
    for table, doc in TABLES.items():
        off = "# " if table in OPT_IN_TABLES else ""  # a table whose presence changes the run: shown commented out
        out += ["", off + ("[[dataset]]" if table == "dataset" else f"[{table}]")]
        out += _comment(doc, width)
        for key in (k for k in KEYS if k.table == table):
            out.append("")
            out += _comment(f"{key.help_text}{_allowed(key)}", width)
            out.append(f"{off}{key.name} = {toml_value(_template_value(key))}")
    return "\n".join(out) + "\n"


def _comment(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False,
                         break_long_words=False)


def _allowed(key: Key) -> str:
    meta = field_meta(key.cls, key.field)
    if key.name == "source":
        return f" (one of: {', '.join(SOURCE_NAMES)})"
    if "choices" in meta and not key.path:
        return f" (one of: {', '.join(map(str, meta['choices']))})"
    if "min" in meta and "max" in meta:
        return f" (from {meta['min']} to {meta['max']})"
    return ""


def _template_value(key: Key) -> Any:
    value = key.default
    if key.cls is InitConfig and value == NO_LORA:
        return ""
    if key.cls is TrainConfig and key.field == "blocks_to_swap" and value == -1:
        return "auto"
    return value
