"""A model set from the Load settings: the family whose package takes the request loads it.

The Load node, the Load Edit node and a run file's [model] (with or without [edit]) make a `LoadRequest` (its paths
found their own way: ComfyUI's model folders, or the run file's), and `load_model_set` asks each registered family
package in turn (`registry.packages()`: those that recognise their own files first, the ones that take whatever is
left last). A package's `load(request)` returns its model set, or None when the request names files or a folder that
are not its own; it decides the text encoder's fp8 'auto' for the device itself, with its own parts' sizes.

Before any package loads, two checks, so that a file never trains as something it is not:
- every model file chosen is opened (its header): a file cut short or damaged is named as such here, before a family
  guesses from its keys (a cut 2.1 file once read as "not 2.1", then as Qwen-Image asking for a 1.x text encoder);
- each package may say, through `misplaced(request)`, that the request names one of its own members where the node
  asking cannot train it (an Edit-2511 transformer in the text-to-image Load node, a Layered one in Load Edit): the
  message names the member and the node or setting that trains it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.config import EDIT_VARIANT_CHOICES, MODEL_SOURCES, NOT_USED
from ..core.errors import UserInputError
from ..models.source import resolve_compute_dtype
from .registry import packages

AUTO_VARIANT = EDIT_VARIANT_CHOICES[0]


@dataclass(frozen=True)
class LoadRequest:
    """The Load settings (core.config.LoadConfig's fields) with paths found, and which node asks."""

    source: str  # one of MODEL_SOURCES
    device: torch.device
    storage: str = "float8"
    compute_dtype: str = "auto"  # "auto" or a torch dtype's name (`dtype` resolves it for the device)
    transformer: Path | None = None  # model files: None where the setting is (not used) or empty
    text_encoder: Path | None = None
    vae: Path | None = None
    tokenizer: Path | None = None  # a tokenizer folder for Qwen2.5-VL (None: the one beside the text encoder)
    diffusers_folder: str = ""
    text_encoder_fp8: str = "dequantize"  # "auto" is decided by the package that loads, for `device`
    # The Load Edit node (or a run file's [edit]): the model set will train on edit datasets; `edit_variant` is that
    # node's choice of Qwen-Image-Edit variant ("auto": read from the files).
    edit: bool = False
    edit_variant: str = AUTO_VARIANT

    def __post_init__(self):
        object.__setattr__(self, "device", torch.device(self.device))
        for name in ("transformer", "text_encoder", "vae", "tokenizer"):
            value = getattr(self, name)  # "" or (not used): none
            object.__setattr__(self, name, Path(value) if value and str(value) != NOT_USED else None)
        object.__setattr__(self, "diffusers_folder", str(self.diffusers_folder or "").strip())
        if self.source not in MODEL_SOURCES:
            raise UserInputError(f"source={self.source!r} is not one of {list(MODEL_SOURCES)}.")

    @property
    def dtype(self) -> torch.dtype:
        return resolve_compute_dtype(self.compute_dtype, self.device)

    def require(self, *names: str, hint: str = "") -> None:
        """Refuse, by setting name, a file this request's loader needs and does not have."""
        for name in names:
            if getattr(self, name) is None:
                raise UserInputError(f"{name} is (not used), but this model needs its {name.replace('_', ' ')} file: "
                                     f"choose one{': ' + hint if hint else ''}.")


def missing_with_file(transformer: Path) -> str | None:
    """What the family of `transformer` (a file) says a request naming only it must add, or None (the usual: the
    text encoder and VAE files). The first package that knows the file answers."""
    for package in packages():
        advice = getattr(package, "missing_with_file", None)
        said = advice(transformer) if advice is not None else None
        if said:
            return said
    return None


def check_files_readable(request: LoadRequest) -> None:
    """Open the header of every model file `request` names (a missing one is its loader's to name): one cut short or
    damaged is refused here, as such (models/safetensors_file.py's message)."""
    from ..models.safetensors_file import SafetensorsFile
    from ..models.source import FILES

    if request.source != FILES:
        return
    for part in ("transformer", "text_encoder", "vae"):
        path = getattr(request, part)
        if path is not None and path.is_file():
            SafetensorsFile(path, part.replace("_", " "))


def load_model_set(request: LoadRequest):
    """The model set `request` names, of the family whose package takes it (module docstring: the checks first)."""
    check_files_readable(request)
    for package in packages():
        misplaced = getattr(package, "misplaced", None)
        why = misplaced(request) if misplaced is not None else None
        if why:
            raise UserInputError(why)
    for package in packages():
        components = package.load(request)
        if components is not None:
            return components
    raise UserInputError(f"no model family reads these Load settings (source {request.source!r}"
                         + (f", transformer {request.transformer}" if request.transformer else "") + ").")
