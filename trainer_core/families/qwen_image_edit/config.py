"""Settings of edit training that text-to-image has not, with help text (widgets and flags come from here,
as from `trainer_core/core/config.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.config import NOT_USED, LoadConfig, _check_range, _f
from ...core.errors import UserInputError
from .variants import VARIANT_CHOICES


@dataclass
class EditDataConfig:
    control_resolution: int = _f(
        0, "Size of the control images the model sees, as the side of a square of the same area (sides multiples "
        "of 32, each control keeps its aspect ratio). 0 = the edit model's own rule: about 1024x1024 px for the "
        "VAE and 384x384 px for the text encoder's view (Edit-2509/2511); Qwen-Image 2.1's reference images: one "
        "size for both, 1024x1024 px of area at 0, and 256 or more (Qwen3-VL enlarges smaller images). Smaller "
        "trains faster with less memory.",
        min=0, max=4096, step=32,
    )

    def validate(self) -> None:
        _check_range(self, "control_resolution")
        if self.control_resolution and self.control_resolution < 64:
            raise UserInputError(f"control_resolution={self.control_resolution} is too small: use 0 (the model's "
                                 "rule) or 64 and more.")


@dataclass
class EditLoadConfig(LoadConfig):
    """How a Qwen-Image-Edit model set is loaded (the Load Edit node): the Load node's settings, an Edit
    transformer preselected, and the variant."""

    transformer: str = _f(
        "qwen_image_edit_2511_fp8_e4m3fn.safetensors", "Qwen-Image-Edit transformer file from models/diffusion_models "
        "(qwen_image_edit_2511_*, qwen_image_edit_2509_* or qwen_image_edit_*; fp8 or bf16).",
        file_list="diffusion_models", extra_choices=(NOT_USED,),
    )
    text_encoder: str = _f(
        "qwen_2.5_vl_7b_fp8_scaled.safetensors", "Qwen2.5-VL 7B text encoder from models/text_encoders, with its vision "
        "tower (qwen_2.5_vl_7b_fp8_scaled has it): the edit model sees the control images through it.",
        file_list="text_encoders", extra_choices=(NOT_USED,),
    )
    edit_variant: str = _f(
        "auto", "Which Qwen-Image-Edit model the transformer is: auto reads it from the file (Edit-2511 by its "
        "marker key, Edit-2509 by '2509' in the name or the folder's pipeline class, else Edit).",
        choices=VARIANT_CHOICES,
    )


@dataclass(frozen=True)
class EditRun:
    """A run file's [edit] table (runs/run_file.py): the Load Edit node's variant and the Edit Dataset node's
    settings."""

    variant: str
    data: EditDataConfig
