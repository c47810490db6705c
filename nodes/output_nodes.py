"""Preview images, loss plot and saving the LoRA."""

from __future__ import annotations

import torch

from ..trainer_core.adapters.lora_files import lora_output_path
from ..trainer_core.core.config import CompareStepsConfig, LossPlotConfig, PreviewConfig, SaveConfig
from ..trainer_core.core.errors import UserInputError
from ..trainer_core.training.live import step_grid
from ..trainer_core.training.plot import loss_plot
from . import host
from .common import CATEGORY, TRAINER, engine_mode, image_to_pil, pil_to_image, pil_to_image_and_mask
from .widgets import widgets


# The two Preview nodes by the names the canvas shows (errors name the node to use instead).
PREVIEW = "Qwen LoRA Preview"
EDIT_PREVIEW = "Qwen LoRA Preview (Edit)"
USE_EDIT_PREVIEW = (f"Replace the node with {EDIT_PREVIEW} (QwenLoRAEditPreview) and wire the control images "
                    "into it (unwired, it edits the first training sample's controls).")


class QwenLoRAPreview:
    DESCRIPTION = (
        "Samples an image with the LoRA as it is now (fixed seed, so previews compare across steps). The "
        "prompt must be one of the Cache node's preview prompts; empty uses the first. Text-to-image; for "
        "Qwen-Image-Edit (and Qwen-Image 2.1 trained on an Edit Dataset) use Qwen LoRA Preview (Edit)."
    )
    CATEGORY = CATEGORY
    FUNCTION = "preview"
    RETURN_TYPES = ("IMAGE", "MASK")
    RETURN_NAMES = ("image", "mask")
    OUTPUT_TOOLTIPS = ("The sampled image (its colours; a Qwen-Image 2.1 preview's transparency is in the mask).",
                       "Where the image is transparent, as Load Image's mask (1 - alpha; Join Image with Alpha "
                       "makes the RGBA picture): Qwen-Image 2.1 previews transparency; other models' previews are "
                       "opaque (all 0).")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "trainer": (TRAINER, {"tooltip": "From Train Steps (so the preview follows training)."}),
            **widgets(PreviewConfig, "prompt", "width", "height", "steps", "cfg", "preview_seed", "weights"),
        }}

    def preview(self, trainer, prompt, width, height, steps, cfg, preview_seed, weights="raw", **undeclared):
        # ComfyUI passes every link a saved prompt holds, declared or not: an older Edit workflow's
        # control_image_N links on this node arrive here and are refused by name rather than ignored.
        if undeclared:
            raise UserInputError(f"{', '.join(sorted(undeclared))}: {PREVIEW} no longer takes control images. "
                                 f"{USE_EDIT_PREVIEW}")
        trainer.require_live()
        if takes_control_images(trainer):
            raise UserInputError(f"{PREVIEW} samples text-to-image models, but this trainer trains "
                                 f"{trainer.components.family.name}. {USE_EDIT_PREVIEW}")
        return preview_image(trainer, prompt, width, height, steps, cfg, preview_seed, weights=weights)


def takes_control_images(trainer) -> bool:
    """Whether the trainer's model edits control images rather than sampling from text alone (its family decides:
    Qwen-Image-Edit does; Qwen-Image 2.1 when it trains on an edit dataset)."""
    return trainer.components.family.takes_condition_images(trainer.dataset)


def preview_image(trainer, prompt: str, width: int, height: int, steps: int, cfg: float, seed: int,
                  control_images: list[torch.Tensor] | None = None, weights: str = "raw"
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Both Preview nodes: sample `prompt` (empty: the first preview prompt) against the cached negative prompt
    with ComfyUI's progress bar; `control_images` (ComfyUI IMAGEs, Edit only) are edited, else the family's
    default controls. `weights`: the adapter's raw weights or their EMA (PreviewConfig.weights). Returns the IMAGE and
    its MASK (transparency: `pil_to_image_and_mask`)."""
    trainer.require_live()
    prompt = prompt.strip() or first_preview_prompt(trainer)
    negative = trainer.dataset.negative_prompt
    progress = host.Progress(steps)
    controls = [image_to_pil(image) for image in control_images or ()]
    with engine_mode():
        image = trainer.sample_preview(prompt, negative, width, height, steps, cfg, seed,
                                       progress=lambda i, n: progress.update(i, total=n),
                                       control_images=controls or None, weights=weights)
    return pil_to_image_and_mask(image)


def first_preview_prompt(trainer) -> str:
    prompts = trainer.dataset.preview_prompts
    if not prompts:
        raise UserInputError("no preview prompt given and the Cache node has none: add preview prompts there.")
    return prompts[0]


class QwenLoRALossPlot:
    DESCRIPTION = ("Plots the loss of every step so far (raw and smoothed) and the validation loss when Init "
                   "Trainer measures it (validation_every).")
    CATEGORY = CATEGORY
    FUNCTION = "plot"
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("image",)
    OUTPUT_TOOLTIPS = ("The loss curve.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "trainer": (TRAINER, {"tooltip": "From Train Steps."}),
            **widgets(LossPlotConfig, "width", "height"),
        }}

    def plot(self, trainer, width, height):
        return (pil_to_image(loss_plot(trainer.progress.loss_history, width, height, title=trainer.train_cfg.run_name,
                                       validation=trainer.progress.validation_history,
                                       datasets=trainer.progress.dataset_loss_history,
                                       previews=trainer.progress.preview_history)),)


class QwenLoRACompareSteps:
    DESCRIPTION = (
        "Lays out the previews Train Steps made so far (its preview_every: same prompt and seed every time) as one "
        "image, a tile per step, labelled by step. The trainer keeps the newest 32, small."
    )
    CATEGORY = CATEGORY
    FUNCTION = "compare"
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("image",)
    OUTPUT_TOOLTIPS = ("The previews side by side, labelled by step.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "trainer": (TRAINER, {"tooltip": "From Train Steps (with preview_every above 0)."}),
            **widgets(CompareStepsConfig, "columns", "tile_size"),
        }}

    def compare(self, trainer, columns, tile_size):
        grid = step_grid(trainer.step_previews, columns, tile_size, title=trainer.train_cfg.run_name,
                         preview_every=trainer.preview_every, step=trainer.step)
        return (pil_to_image(grid),)


class QwenLoRASave:
    DESCRIPTION = (
        "Saves the LoRA into ComfyUI's loras folder in the layout ComfyUI's LoRA loaders (and diffusers) load "
        "with no unmatched keys, with rank, alpha, targets and steps in its metadata. With the Optimizer node's ema "
        "on, the EMA of the weights goes beside it as name_ema.safetensors."
    )
    CATEGORY = CATEGORY
    FUNCTION = "save"
    OUTPUT_NODE = True
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("path",)
    OUTPUT_TOOLTIPS = ("Where the file was written.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "trainer": (TRAINER, {"tooltip": "From Train Steps."}),
            **widgets(SaveConfig, "filename", "dtype", "layout"),
        }}

    def save(self, trainer, filename, dtype, layout="comfyui"):
        if trainer.step == 0:  # Train Steps at 0 steps (captions and cache only): an untrained LoRA is no LoRA
            text = (f"nothing saved: run '{trainer.train_cfg.run_name}' is at step 0 (nothing trained yet). Set Train "
                    "Steps' steps above 0 and queue again.")
            return {"ui": {"text": [text]}, "result": ("",)}
        path = lora_output_path(host.loras_directory(), filename, trainer.train_cfg.run_name, trainer.step)
        with engine_mode():
            trainer.save_lora(path, getattr(torch, dtype), layout=layout)
        return {"ui": {"text": [str(path)]}, "result": (str(path),)}
