"""The repository imported as ComfyUI imports a custom node folder: from its __init__.py, under a mangled module name
(never as a top-level `nodes` package), once per process. For the tools that read the nodes' definitions
(build_workflows.py, build_docs.py); the tests have their own in tests/conftest.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_pack():
    name = str(REPO).replace(".", "_x_")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
