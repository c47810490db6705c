"""The only module that touches ComfyUI. Every host call is imported lazily, at execution time, and
falls back to a standalone behaviour when ComfyUI is absent (tests, scripts)."""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import torch


def _host(module: str) -> ModuleType | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def compute_device() -> torch.device:
    mm = _host("comfy.model_management")
    if mm is not None:
        return torch.device(mm.get_torch_device())
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def check_interrupt() -> None:
    """Raise ComfyUI's InterruptProcessingException if the user pressed Cancel (no-op standalone)."""
    mm = _host("comfy.model_management")
    if mm is not None:
        mm.throw_exception_if_processing_interrupted()


def free_host_models() -> None:
    """Ask ComfyUI to unload its own models and empty its cache before training claims the GPU."""
    mm = _host("comfy.model_management")
    if mm is not None:
        mm.unload_all_models()
        mm.soft_empty_cache()


class Progress:
    """ComfyUI's progress bar on the running node (with an optional preview image); silent standalone."""

    def __init__(self, total: int):
        utils = _host("comfy.utils")
        self.bar = utils.ProgressBar(total) if utils is not None else None
        self.total = total

    def update(self, value: int, preview=None, total: int | None = None, max_size: int | None = None) -> None:
        """`preview`: a PIL image shown on the node, as a JPEG scaled to fit `max_size` (default: its own size;
        ComfyUI scales up as well as down to it)."""
        if total is not None:
            self.total = total
        if self.bar is not None:
            shown = None if preview is None else ("JPEG", preview, max_size or max(preview.size))
            self.bar.update_absolute(value, self.total, shown)
        check_interrupt()


def output_directory() -> Path:
    fp = _host("folder_paths")
    if fp is not None:
        return Path(fp.get_output_directory())
    return Path(os.environ.get("QWEN_LORA_OUTPUT", "output")).resolve()


def input_directory() -> Path:
    """ComfyUI's input folder (where relative dataset folders live); standalone: $QWEN_LORA_INPUT or ./input."""
    fp = _host("folder_paths")
    if fp is not None:
        return Path(fp.get_input_directory()).resolve()
    return Path(os.environ.get("QWEN_LORA_INPUT", "input")).resolve()


def input_subfolders() -> list[str]:
    """The input folder's subfolders (one level, hidden ones left out), sorted by name."""
    folder = input_directory()
    try:
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def loras_directory() -> Path:
    """The first folder ComfyUI lists LoRAs from (models/loras by default)."""
    fp = _host("folder_paths")
    if fp is not None:
        return Path(fp.get_folder_paths("loras")[0])
    return Path(os.environ.get("QWEN_LORA_LORAS", "models/loras")).resolve()


def _standalone_models_root() -> Path:
    return Path(os.environ.get("QWEN_LORA_MODELS", "models")).resolve()


def model_file_list(kind: str) -> list[str]:
    """File names ComfyUI lists for a model folder kind ('diffusion_models', 'text_encoders', 'vae', 'loras').
    Standalone: the .safetensors files under $QWEN_LORA_MODELS/<kind>."""
    fp = _host("folder_paths")
    if fp is not None:
        try:
            return list(fp.get_filename_list(kind))
        except KeyError:
            return []
    folder = _standalone_models_root() / kind
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.safetensors")) if folder.is_dir() else []


def model_file_path(kind: str, name: str) -> Path:
    """Full path of a listed model file; a missing one raises an error that names it."""
    from ..trainer_core.core.errors import UserInputError

    fp = _host("folder_paths")
    if fp is None:  # (ComfyUI's get_full_path keeps a name inside its folders itself)
        relative = Path(name.replace("\\", "/"))
        if relative.is_absolute() or ".." in relative.parts or name.startswith("~"):
            raise UserInputError(f"model file {name!r} is not a name inside the {kind} folder "
                                 f"{_standalone_models_root() / kind}: choose one of the files listed there.")
    path = fp.get_full_path(kind, name) if fp is not None else _standalone_models_root() / kind / name
    if not path or not Path(path).is_file():
        raise UserInputError(f"model file {name!r} was not found in the {kind} folder. Put it in models/{kind}/ "
                             "and press R in the canvas to refresh the lists.")
    return Path(path)


def bundled_qwen_tokenizer() -> Path | None:
    """The Qwen2.5 tokenizer ComfyUI ships (comfy/text_encoders/qwen25_tokenizer), if ComfyUI is here."""
    import importlib.util

    spec = importlib.util.find_spec("comfy")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "text_encoders" / "qwen25_tokenizer"
    return folder if folder.is_dir() else None


TEMPLATE_LISTS = ("/workflow_templates", "/api/workflow_templates")  # what the template browser asks ComfyUI


def _name_order(name: str) -> tuple:
    """"2 Qwen-Image ..." before "10 ...": the leading number as a number, then the name."""
    number = re.match(r"\d+", name)
    return (int(number.group()) if number else float("inf"), name)


def order_workflow_templates(pack_folder: str) -> bool:
    """ComfyUI lists a pack's example workflows (GET /api/workflow_templates: pack folder -> file names) in the order
    its folder gives them (glob: on Linux's ext4 an order of name hashes), and the template browser shows them in
    that order (its Alphabetical sort aside). This puts the list of the pack in `pack_folder` in its names' order
    ("1 First run ..." first) in ComfyUI's answer, every other pack's list as it was: a middleware on ComfyUI's web
    app, added while ComfyUI imports the pack, before its server starts. Without ComfyUI's server (tests, scripts) or
    once it runs, nothing changes: returns whether the middleware was added."""
    server = sys.modules.get("server")  # ComfyUI's, imported before any custom node; never imported here
    app = getattr(getattr(getattr(server, "PromptServer", None), "instance", None), "app", None)
    if app is None or getattr(app, "frozen", True):
        return False
    from aiohttp import web

    @web.middleware
    async def ordered_templates(request, handler):
        response = await handler(request)
        if request.method != "GET" or request.path not in TEMPLATE_LISTS or not isinstance(response, web.Response):
            return response
        try:
            listing = json.loads(response.body)
            names = listing[pack_folder]
            ordered = sorted(names, key=_name_order)
        except (KeyError, TypeError, ValueError):  # not this pack's, or not a list of names: as ComfyUI answered
            return response
        return web.json_response({**listing, pack_folder: ordered})

    app.middlewares.append(ordered_templates)
    return True
