"""Live trainers by run name.

ComfyUI may drop a node's cached output at any time (memory pressure, /free, restart), so the trainer
must not live only there: the init node looks its run up here first and continues it.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_live: dict[str, tuple[Any, str]] = {}  # run name -> (trainer, signature of what it was built from)


def find(run_name: str, signature: str) -> Any | None:
    """The live trainer of `run_name` if it was built from the same inputs (`signature`), else None."""
    with _lock:
        entry = _live.get(run_name)
    return entry[0] if entry and entry[1] == signature else None


def register(run_name: str, trainer: Any, signature: str) -> None:
    with _lock:
        _live[run_name] = (trainer, signature)


def retire(run_name: str) -> Any | None:
    """Remove and return the live trainer of `run_name` (the caller closes it)."""
    with _lock:
        entry = _live.pop(run_name, None)
    return entry[0] if entry else None


def retire_users_of(transformer: Any) -> list[Any]:
    """Remove and return every live trainer that trains `transformer` (one adapter per model at a time)."""
    with _lock:
        names = [n for n, (t, _) in _live.items() if getattr(t, "transformer", None) is transformer]
        return [_live.pop(n)[0] for n in names]


def live_runs() -> list[str]:
    with _lock:
        return list(_live)
