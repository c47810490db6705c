"""A stand-in for the three ComfyUI host modules our nodes call (comfy.model_management, comfy.utils),
with ComfyUI's names and behaviour, so the interrupt path can be tested without ComfyUI. It replaces
the host, never our code: nodes/host.py imports these modules exactly as it imports ComfyUI's."""

from __future__ import annotations

import sys
import types

import torch


class InterruptProcessingException(Exception):
    """ComfyUI raises this (an Exception in 0.3.64, a BaseException in later versions) on Cancel."""


def install(monkeypatch, interrupt_at: tuple[int, int] | None = None, base_exception: bool = False):
    """Install comfy.model_management / comfy.utils stand-ins; the user 'presses Cancel' when a progress
    bar of total `interrupt_at[0]` reaches value `interrupt_at[1]`."""
    exc = type("InterruptProcessingException", (BaseException if base_exception else Exception,), {})
    state = {"interrupted": False, "updates": 0, "unloaded": 0, "armed": interrupt_at is not None,
             "previews": []}  # (value, total, (format, PIL image, max_size)) of every update that carried one

    mm = types.ModuleType("comfy.model_management")
    mm.InterruptProcessingException = exc
    mm.get_torch_device = lambda: torch.device("cpu")

    def throw_exception_if_processing_interrupted():
        if state["interrupted"]:
            state["interrupted"] = False
            raise exc()

    def unload_all_models():
        state["unloaded"] += 1

    mm.throw_exception_if_processing_interrupted = throw_exception_if_processing_interrupted
    mm.unload_all_models = unload_all_models
    mm.soft_empty_cache = lambda force=False: None

    utils = types.ModuleType("comfy.utils")

    class ProgressBar:
        def __init__(self, total, node_id=None):
            self.total, self.current = total, 0

        def update_absolute(self, value, total=None, preview=None):
            self.total = total if total is not None else self.total
            self.current = value
            state["updates"] += 1
            if preview is not None:
                state["previews"].append((value, self.total, preview))
            if state["armed"] and (self.total, value) == tuple(interrupt_at):
                state["interrupted"], state["armed"] = True, False  # one press of Cancel

    utils.ProgressBar = ProgressBar
    comfy = types.ModuleType("comfy")
    comfy.model_management, comfy.utils = mm, utils
    for name, module in (("comfy", comfy), ("comfy.model_management", mm), ("comfy.utils", utils)):
        monkeypatch.setitem(sys.modules, name, module)
    return exc, state


def install_folder_paths(monkeypatch, base):
    """A stand-in for ComfyUI's `folder_paths` with its folder layout under `base` (input/, output/,
    models/<kind>/): the calls nodes/host.py makes, with ComfyUI's names."""
    from pathlib import Path

    base = Path(base)
    fp = types.ModuleType("folder_paths")
    fp.get_input_directory = lambda: str(base / "input")
    fp.get_output_directory = lambda: str(base / "output")
    fp.get_folder_paths = lambda kind: [str(base / "models" / kind)]

    def get_filename_list(kind):
        folder = base / "models" / kind
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.safetensors")) if folder.is_dir() else []

    def get_full_path(kind, name):
        path = base / "models" / kind / name
        return str(path) if path.is_file() else None

    fp.get_filename_list, fp.get_full_path = get_filename_list, get_full_path
    for sub in ("input", "output"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    monkeypatch.setitem(sys.modules, "folder_paths", fp)
    return fp
