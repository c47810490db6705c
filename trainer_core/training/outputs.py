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
from ..core.config import LoraConfig
from ..core.files import remove_leftovers, write_error, write_safetensors_atomic
from ..core.host_memory import give_back_freed_memory
from ..families.sampling import sample_image
from .ema import averaged_weights, ema_path
from .live import PreviewSettings, StepPreview, keep_preview
from .optim import evaluation_weights, is_schedule_free
from .setup import Built, Decided

# The trainer checks that it may give these out (live, not broken) before it calls them (recipe.py).


def lora_state_dict(built: Built, lora: LoraConfig, run_name: str, dtype: torch.dtype = torch.bfloat16,
                    layout: str = "comfyui", weights: str = "raw") -> dict[str, torch.Tensor]:
    """The adapter's tensors in `layout`, at the rank and alpha of `lora` (the adapter's settings as decided)."""
    # schedule-free AdamW: the averaged weights, not the training ones
    with evaluation_weights(built.optimizer), averaged_weights(built.ema, built.params, run_name, weights):
        tensors = lora_file_tensors(built.transformer, lora.rank, lora.alpha, dtype, layout)
        if is_schedule_free(built.optimizer) or weights != "raw":  # float32 CPU tensors alias the weights,
            tensors = {k: v.clone() for k, v in tensors.items()}  # which are put back next
    return tensors


def lora_metadata(built: Built, decided: Decided, run_name: str, step: int, base_model: str,
                  layout: str = "comfyui", weights: str = "raw", base_licence: str = "") -> dict[str, str]:
    """Rank, alpha, targets, steps (all the weights have seen, a continued file's included: the run is at `step`),
    base model and the licence of its weights (`ModelFamily.weights_licence`: the LoRA derives from them)."""
    init, lora = decided.init_lora, decided.lora
    init_steps = (init.steps or 0) if init is not None else 0
    extra = {"qwen_lora.run_name": run_name, "qwen_lora.base_fingerprint": built.base_fingerprint,
             "qwen_lora.run_steps": str(step)}
    if base_licence:  # modelspec's key for a model's licence, which tools that read modelspec show
        extra |= {"qwen_lora.base_licence": base_licence, "modelspec.license": base_licence}
    if init is not None:
        extra["qwen_lora.init_lora"] = init.path.name
        extra["qwen_lora.init_lora_steps"] = str(init.steps) if init.steps is not None else "unknown"
    if set(decided.modules) != set(target_module_names(built.transformer, lora.targets)):
        extra["qwen_lora.targets"] = "custom"
        extra["qwen_lora.modules"] = json.dumps(list(decided.modules))
    if weights == "ema":
        extra.update({"qwen_lora.weights": "ema", "qwen_lora.ema_decay": str(built.ema.decay),
                      "qwen_lora.ema_updates": str(built.ema.updates)})
    extra.update(layout_metadata(layout, lora.rank, lora.alpha))
    return file_metadata(lora, init_steps + step, base_model, extra)


def save_lora(built: Built, decided: Decided, run_name: str, step: int, base_model: str, path,
              dtype: torch.dtype = torch.bfloat16, layout: str = "comfyui", base_licence: str = "") -> Path:
    """Write the adapter in `layout` (lora_files.LORA_LAYOUTS; default ComfyUI's), atomically; return the path.
    With EMA on, its file `ema.ema_path(path)` is written too (after the raw one)."""
    remove_leftovers(Path(path).parent, names=r".+\.safetensors")  # of killed saves (theirs, never a user's)
    written = _write_lora(built, decided, run_name, step, base_model, path, dtype, layout, "raw", base_licence)
    if built.ema is not None:
        _write_lora(built, decided, run_name, step, base_model, ema_path(path), dtype, layout, "ema", base_licence)
    give_back_freed_memory()  # the file's CPU copies: small tensors that would stay in the heap (host_memory.py)
    return written


def _write_lora(built: Built, decided: Decided, run_name: str, step: int, base_model: str, path,
                dtype: torch.dtype, layout: str, weights: str, base_licence: str) -> Path:
    try:
        return write_safetensors_atomic(lora_state_dict(built, decided.lora, run_name, dtype, layout, weights), path,
                                        lora_metadata(built, decided, run_name, step, base_model, layout, weights,
                                                      base_licence))
    except OSError as e:
        raise write_error(e, "LoRA file", Path(path),
                          f"Any earlier {Path(path).name} is intact and the trainer still holds step "
                          f"{step}.") from None


def sample_preview(components, dataset, built: Built, run_name: str, prompt: str, negative_prompt: str = "",
                   width: int = 1024, height: int = 1024, steps: int = 20, cfg_scale: float = 4.0, seed: int = 0,
                   progress: Callable[[int, int], None] | None = None,
                   control_images: list[Image.Image] | None = None, weights: str = "raw") -> Image.Image:
    """An image from the adapter as it is now (`sampling.sample_image`; the prompts must be cached), from its
    `weights` ('raw' or 'ema'). An edit model edits `control_images`, or else a training sample's controls (the
    family's preview hooks)."""
    # schedule-free AdamW samples at its averaged weights; 'ema' at the EMA (raw weights back after, exactly)
    with evaluation_weights(built.optimizer), averaged_weights(built.ema, built.params, run_name, weights):
        return sample_image(components, dataset, prompt, negative_prompt, width, height, steps,
                            cfg_scale, seed, progress=progress, condition_images=control_images)


def preview_step(components, dataset, built: Built, run_name: str, step: int, kept: list[StepPreview],
                 settings: PreviewSettings, progress: Callable[[int, int], None] | None = None) -> StepPreview:
    """Sample `settings` now (the run at `step`), keep a small copy in `kept`, return it full size (sampling runs
    in eval mode, with its own generator)."""
    started = time.perf_counter()
    image = sample_preview(components, dataset, built, run_name, settings.prompt, settings.negative_prompt,
                           settings.size, settings.size, settings.steps, settings.cfg, settings.seed,
                           progress=progress)
    preview = StepPreview(step, image, time.perf_counter() - started)
    keep_preview(kept, preview)
    return preview
