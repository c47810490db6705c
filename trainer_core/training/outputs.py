"""What a trainer gives out: LoRA files (and their tensors and metadata) and preview images of the adapter now.

`weights` chooses what they are made of: 'raw' (the weights as trained) or 'ema' (their EMA, ema.py). With EMA on,
`save_lora` writes both files: `name.safetensors` (raw) and `name_ema.safetensors` beside it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image

from ..adapters.lora import target_module_names
from ..adapters.lora_files import layout_metadata, lora_file_tensors
from ..adapters.lora_files import lora_metadata as file_metadata
from ..core.errors import TrainingStopped
from ..core.files import remove_leftovers, write_error, write_safetensors_atomic
from ..families.sampling import sample_image
from .ema import averaged_weights, ema_path
from .live import PreviewSettings, StepPreview, keep_preview
from .optim import evaluation_weights, is_schedule_free

# `trainer` below is the recipe's Trainer (recipe.py), which holds the state these functions work on; it is
# not imported here, so the recipe's components stay below the recipe.


def lora_state_dict(trainer: "Trainer", dtype: torch.dtype = torch.bfloat16,
                    layout: str = "comfyui", weights: str = "raw") -> dict[str, torch.Tensor]:
    trainer.require_live()
    if trainer.broken_reason is not None:
        raise TrainingStopped(trainer.broken_reason)
    # schedule-free AdamW: the averaged weights, not the training ones
    with evaluation_weights(trainer.optimizer), averaged_weights(trainer, weights):
        tensors = lora_file_tensors(trainer.transformer, trainer.lora_cfg.rank, trainer.lora_cfg.alpha, dtype, layout)
        if is_schedule_free(trainer.optimizer) or weights != "raw":  # float32 CPU tensors alias the weights,
            tensors = {k: v.clone() for k, v in tensors.items()}  # which are put back next
    return tensors


def lora_metadata(trainer: "Trainer", layout: str = "comfyui", weights: str = "raw") -> dict[str, str]:
    """Rank, alpha, targets, steps (all the weights have seen, a continued file's included), base model."""
    init = trainer.init_lora
    init_steps = (init.steps or 0) if init is not None else 0
    extra = {"qwen_lora.run_name": trainer.train_cfg.run_name, "qwen_lora.base_fingerprint": trainer.base_fingerprint,
             "qwen_lora.run_steps": str(trainer.step)}
    if init is not None:
        extra["qwen_lora.init_lora"] = init.path.name
        extra["qwen_lora.init_lora_steps"] = str(init.steps) if init.steps is not None else "unknown"
    if set(trainer.lora_modules) != set(target_module_names(trainer.transformer, trainer.lora_cfg.targets)):
        extra["qwen_lora.targets"] = "custom"
        extra["qwen_lora.modules"] = json.dumps(trainer.lora_modules)
    if weights == "ema":
        extra.update({"qwen_lora.weights": "ema", "qwen_lora.ema_decay": str(trainer.ema.decay),
                      "qwen_lora.ema_updates": str(trainer.ema.updates)})
    extra.update(layout_metadata(layout, trainer.lora_cfg.rank, trainer.lora_cfg.alpha))
    return file_metadata(trainer.lora_cfg, init_steps + trainer.step, trainer.components.name, extra)


def save_lora(trainer: "Trainer", path, dtype: torch.dtype = torch.bfloat16, layout: str = "comfyui") -> Path:
    """Write the adapter in `layout` (lora_files.LORA_LAYOUTS; default ComfyUI's), atomically; return the path.
    With EMA on, its file `ema.ema_path(path)` is written too (after the raw one)."""
    remove_leftovers(Path(path).parent, names=r".+\.safetensors")  # of killed saves (theirs, never a user's)
    written = _write_lora(trainer, path, dtype, layout, "raw")
    if trainer.ema is not None:
        _write_lora(trainer, ema_path(path), dtype, layout, "ema")
    return written


def _write_lora(trainer: "Trainer", path, dtype: torch.dtype, layout: str, weights: str) -> Path:
    try:
        return write_safetensors_atomic(lora_state_dict(trainer, dtype, layout, weights), path,
                                        lora_metadata(trainer, layout, weights))
    except OSError as e:
        raise write_error(e, "LoRA file", Path(path),
                          f"Any earlier {Path(path).name} is intact and the trainer still holds step "
                          f"{trainer.step}.") from None


def sample_preview(trainer: "Trainer", prompt: str, negative_prompt: str = "", width: int = 1024, height: int = 1024,
                   steps: int = 20, cfg_scale: float = 4.0, seed: int = 0,
                   progress: Callable[[int, int], None] | None = None,
                   control_images: list[Image.Image] | None = None, weights: str = "raw") -> Image.Image:
    """An image from the adapter as it is now (`sampling.sample_image`; the prompts must be cached), from its
    `weights` ('raw' or 'ema'). An edit model edits `control_images`, or else a training sample's controls (the
    family's preview hooks)."""
    trainer.require_live()
    # schedule-free AdamW samples at its averaged weights; 'ema' at the EMA (raw weights back after, exactly)
    with evaluation_weights(trainer.optimizer), averaged_weights(trainer, weights):
        return sample_image(trainer.components, trainer.dataset, prompt, negative_prompt, width, height, steps,
                            cfg_scale, seed, progress=progress, condition_images=control_images)


def preview_step(trainer: "Trainer", settings: PreviewSettings,
                 progress: Callable[[int, int], None] | None = None) -> StepPreview:
    """Sample `settings` now, keep a small copy in `step_previews`, return it full size (sampling runs in eval
    mode, with its own generator)."""
    started = time.perf_counter()
    image = sample_preview(trainer, settings.prompt, settings.negative_prompt, settings.size, settings.size,
                           settings.steps, settings.cfg, settings.seed, progress=progress)
    preview = StepPreview(trainer.step, image, time.perf_counter() - started)
    keep_preview(trainer.step_previews, preview)
    return preview
