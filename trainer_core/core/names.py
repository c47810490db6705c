"""Names the trainer turns into files and folders: portable on every OS, and templates that fill in only
what they document.

A name that works on Linux but not on Windows or a case-insensitive disk breaks a workflow the day it moves,
so the same rules apply everywhere: no control characters (NUL included), none of Windows' forbidden
characters, no reserved device names (CON, PRN, AUX, NUL, COM0-9, LPT0-9, with any extension, any case), no
trailing dot or space, at most 255 bytes per file or folder name.
"""

from __future__ import annotations

import string

from .errors import UserInputError

MAX_COMPONENT_BYTES = 255  # NAME_MAX of ext4, APFS, NTFS (in UTF-8 bytes, the strictest reading)
WINDOWS_FORBIDDEN = '<>:"|?*'
_DIGITS = "0123456789\u00b9\u00b2\u00b3"  # Windows also reserves COM¹, COM², COM³ (and LPT's)
WINDOWS_RESERVED = frozenset(
    {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"} | {f"{p}{d}" for p in ("COM", "LPT") for d in _DIGITS}
)


def component_problem(part: str, max_bytes: int = MAX_COMPONENT_BYTES) -> str | None:
    """Why `part` (one file or folder name) is not portable, or None if it is."""
    for i, ch in enumerate(part):
        if ord(ch) < 32 or ord(ch) == 127:
            return f"it contains the control character {ch!r} at position {i}"
        if ch in WINDOWS_FORBIDDEN:
            return f"it contains {ch!r}, which Windows does not allow in file names ({WINDOWS_FORBIDDEN})"
    device = part.split(".")[0].rstrip(" ").upper()
    if device in WINDOWS_RESERVED:
        return (f"{part!r} is a reserved device name on Windows (CON, PRN, AUX, NUL, COM0-9, LPT0-9, with any "
                "extension, any case)")
    if part.endswith((".", " ")) and part not in (".", ".."):
        return f"{part!r} ends with a dot or a space, which Windows drops"
    size = len(part.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return f"the name {part[:24]!r}... is {size} bytes long; at most {max_bytes} bytes per file or folder name"
    return None


def shown(value: str, width: int = 80) -> str:
    """`value`'s repr for a message, cut to about `width` characters."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 4] + "...'"


def check_component(part: str, what: str, value: str, max_bytes: int = MAX_COMPONENT_BYTES) -> None:
    problem = component_problem(part, max_bytes)
    if problem is not None:
        raise UserInputError(
            f"{what}={shown(value)} is not a usable name on every system: {problem}. Choose another name "
            "(letters, digits, '_', '-', '.'), so the workflow also works on Windows and macOS."
        )


def fill_template(template: str, what: str, **values: str) -> str:
    """`template` with each `{name}` of `values` filled in and `{{`/`}}` as literal braces. Nothing else is
    evaluated: any other field, attribute or index access, conversion, format spec or unbalanced brace is an
    error that names the input `what`."""
    allowed = " and ".join(f"{{{name}}}" for name in values)
    try:
        pieces = list(string.Formatter().parse(template))
    except ValueError as e:
        raise UserInputError(
            f"{what}={shown(template)} is not a valid name template ({e}). Use only {allowed} as placeholders; "
            "write a literal brace as {{ or }}."
        ) from None
    out = []
    for literal, field, spec, conversion in pieces:
        out.append(literal)
        if field is None:
            continue
        if field not in values or spec or conversion:
            placeholder = "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise UserInputError(
                f"{what}={shown(template)} has the placeholder {placeholder}. Use only {allowed} (no positions, "
                "attributes, indexes or formats); write a literal brace as {{ or }}."
            )
        out.append(values[field])
    return "".join(out)


def template_fields(template: str) -> set[str]:
    """The placeholders `template` names ({{ and }} are literal braces); an unparsable template names none (its
    use through `fill_template` says what is wrong with it)."""
    try:
        return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
    except ValueError:
        return set()


def require_step(template: str, what: str, saves: str) -> None:
    """Refuse a LoRA name template without {step} where `saves` (a setting, shown) writes one file per step."""
    if "step" not in template_fields(template):
        raise UserInputError(
            f"{what} = {shown(template)} has no {{step}}, but {saves} saves a LoRA snapshot each time: each would "
            "overwrite the one before. Put {step} in the name (for example '{run_name}_{step}'), or turn the "
            "snapshots off.")
