"""Runs one of our probe scripts (tests/comfy_*.py) with ComfyUI's Python inside a ComfyUI checkout, for the
host tests: the probe reads a JSON request, does its work with ComfyUI's own code, and prints a JSON line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_probe(script: str, comfyui: str, request: Path, timeout: int) -> subprocess.CompletedProcess:
    """Run tests/`script` with COMFYUI_PYTHON (else this Python) in `comfyui` on `request`; assert it succeeded."""
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    result = subprocess.run(
        [python, "-B", str(Path(__file__).with_name(script)), comfyui, str(request)],
        cwd=comfyui, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result
