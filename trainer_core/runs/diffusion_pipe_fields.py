"""What each diffusion-pipe setting becomes here, and why: the importer's tables (diffusion_pipe.py reads them)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..core.errors import UserInputError

# Optimizers of diffusion-pipe (lower-case `type`) -> (ours, why / what differs). These keep lr, betas,
# weight_decay and eps; automagic keeps lr and weight_decay; the rest run as 8-bit AdamW at its default rate.
ADAMW_FAMILY = {
    "adamw": ("adamw", ""),
    "adamw8bit": ("adamw8bit", ""),
    "adamw_optimi": ("adamw_kahan", "optimi's AdamW, with its Kahan summation for bfloat16 LoRA weights, as there"),
    "adamw8bitkahan": ("adamw_kahan", "AdamW with Kahan summation for bfloat16 LoRA weights (optimi's: its states "
                                      "are 16-bit, not 8-bit; no 8-bit AdamW here sums with Kahan)"),
    "prodigy": ("prodigy", "Prodigy (prodigyopt): lr multiplies the step size it estimates"),
    "stableadamw": ("adamw", "StableAdamW's update clipping is not offered: AdamW with gradient clipping"),
    "offload": ("adamw", "AdamW; its CPU offload is not needed: a LoRA's optimizer state is small"),
}
# diffusion-pipe optimizers that keep bfloat16 LoRA weights exact (Kahan summation) where ours does not: a
# float32 LoRA does that here. (automagic here computes in float32 but writes bf16 weights rounded.)
COMPENSATING = ("automagic",)
AUTOMAGIC_LR = 1e-6  # its published starting rate (ai-toolkit's and diffusion-pipe's default lr)
AUTOMAGIC_WHY = ("automagic (automagic.py: ai-toolkit's per-value self-adjusting learning rate, written from its "
                 "description); its other settings stay at the published defaults (min_lr 1e-7, max_lr 1e-3, "
                 "lr_bump 1e-6, beta2 0.999, clip_threshold 1.0)")
EVAL_WHY = ("validation here holds images out of the training folder: set [[dataset]] validation_images and "
            "[train] validation_every (there are no separate eval datasets)")
PIPELINE_WHY = ("pipeline parallelism (one model split across GPUs) is not offered: every GPU holds the whole "
                "float8 model and swaps blocks as it needs; for several GPUs start one process each with "
                "`torchrun --nproc-per-node N -m trainer_core train ...` (data parallel)")
CHECKPOINT_WHY = ("checkpoints go by steps here ([train] checkpoint_every) and on Ctrl-C, each one resumable bit "
                  "for bit by running the same command again")
NO_BOARD_WHY = "no TensorBoard or wandb: the run folder gets losses.json and loss.png, the terminal every step's loss"
GENERIC_IGNORED = {
    "pseudo_huber_c": "the loss is the flow-matching mean squared error",
    "reentrant_activation_checkpointing": "checkpointing is always torch's non-reentrant form here",
    "partition_method": PIPELINE_WHY, "partition_split": PIPELINE_WHY, "pipeline_stages": PIPELINE_WHY,
    "checkpoint_every_n_epochs": CHECKPOINT_WHY, "checkpoint_every_n_minutes": CHECKPOINT_WHY,
    "map_num_proc": "images are read and encoded in this process, each entry alone",
    "compile": "torch.compile is not used: block swapping and checkpointing replace the blocks' forward",
    "steps_per_print": "the progress shows every step's loss, learning rate and seconds per step",
    "logging_steps": NO_BOARD_WHY, "x_axis_examples": NO_BOARD_WHY, "monitoring": NO_BOARD_WHY,
    "video_clip_mode": "images only (Qwen-Image)",
    "regenerate_cache": "the cache is keyed by content: changed images and captions are encoded again by themselves",
    "resume_from_checkpoint": "running the same command again resumes from the newest checkpoint",
    "eval_datasets": EVAL_WHY, "eval_every_n_epochs": EVAL_WHY, "eval_every_n_steps": EVAL_WHY,
    "eval_every_n_examples": EVAL_WHY, "eval_before_first_step": EVAL_WHY, "eval_micro_batch_size_per_gpu": EVAL_WHY,
    "image_eval_micro_batch_size_per_gpu": EVAL_WHY, "eval_gradient_accumulation_steps": EVAL_WHY,
    "disable_block_swap_for_eval": EVAL_WHY,
    "model.guidance": "Qwen-Image has no guidance input",
    "adapter.fuse_adapters": "fusing other LoRAs into the base weights before training is not offered",
    "adapter.exclude_modules": "modules are chosen by [lora] targets (attention, attention+mlp, all), not by name",
    "adapter.decompose_factor": "a LoKr setting (a LoRA trains here)", "adapter.rank_dropout": "a LoKr setting",
    "optimizer.gradient_release": "a memory trick for full fine-tuning; a LoRA's gradients are small",
    "optimizer.stabilize": "an AdamW8bitKahan setting with no counterpart in bitsandbytes' 8-bit AdamW",
}
DATASET_IGNORED = {
    "num_ar_buckets": "buckets here are every 32 px between the smallest and largest side that min_ar..max_ar give",
    "frame_buckets": "video only (images train in one frame)",
    "size_buckets": "fixed (width, height, frames) buckets are not offered: aspect buckets at the resolution are used",
    "cache_shuffle_num": "captions train as written (shuffled tags would need an embedding per order)",
    "cache_shuffle_delimiter": "captions train as written", "shuffle_tags": "captions train as written",
    "caption_prefix": "not offered: put the prefix into the caption files",
    "shuffle_metadata": "no effect here (the data order is shuffled per epoch from the seed)",
    "online_captions": "captions come from the .txt files beside the images",
    "subsample_ratio": "every image of a folder trains (use repeats to weigh folders)",
    "mask_path": "masks are read from the dataset folder: put them beside the images as <name>_mask.png or in its "
                 "masks/ subfolder (README: Masked loss; set mask_background_weight 0 for diffusion-pipe's black = "
                 "no loss)",
    "default_mask_file": "one mask for every image is not offered: give each image its own mask",
    "control_path": "Edit training (control images) is not offered",
}
DEFAULT_AR = (0.5, 2.0)
# Dataset settings (top level, or a [[directory]]'s own) that become [[dataset]] keys.
MAPPED_DATASET_KEYS = ("resolutions", "enable_ar_bucket", "min_ar", "max_ar", "ar_buckets", "skip_empty_caption",
                       "num_repeats")


def resolutions(values: Any, path: Path) -> list[tuple[int, str]]:
    """Each resolution (a side, or [width, height]: its area) as a side that is a multiple of 32, with a note."""
    if values is None:
        raise UserInputError(f"diffusion-pipe dataset file {path} has no resolutions (resolutions = [1024], say).")
    out = []
    for value in values if isinstance(values, list) else [values]:
        area_side = math.sqrt(value[0] * value[1]) if isinstance(value, list) else float(value)
        side = max(64, round(area_side / 32) * 32)
        why = f"resolutions: {value}" + (f" (about {area_side:.0f} px: a multiple of 32 here)"
                                          if side != area_side else "")
        out.append((side, why))
    return out


def aspect_range(settings: dict) -> tuple[float, float, str]:
    """(smallest, largest width/height ratio, where they come from)."""
    if settings.get("ar_buckets"):
        ratios = [w / h if isinstance(b, list) else float(b) for b in settings["ar_buckets"]
                  for w, h in ([b] if isinstance(b, list) else [(float(b), 1.0)])]
        return min(ratios), max(ratios), f"ar_buckets {min(ratios):.2f}..{max(ratios):.2f}"
    low, high = settings.get("min_ar", DEFAULT_AR[0]), settings.get("max_ar", DEFAULT_AR[1])
    return float(low), float(high), f"min_ar {low} .. max_ar {high}"


def global_batch(main: dict) -> int:
    """A diffusion-pipe config's examples per optimizer step on one process (micro-batch x accumulation)."""
    micro = main.get("image_micro_batch_size_per_gpu", main.get("micro_batch_size_per_gpu", 1))
    micro = min(int(b) for _, b in micro) if isinstance(micro, list) else int(micro)
    return micro * int(main.get("gradient_accumulation_steps", 1))


def shift_text() -> str:
    """The resolution shift's factor at three sizes, for the translation's note on `timestep_sample_method`."""
    from ..models.scheduler import QWEN_IMAGE_SCHEDULER_CONFIG
    from ..training.objective import resolution_mu

    shifts = [f"{math.exp(resolution_mu((side // 16) ** 2, QWEN_IMAGE_SCHEDULER_CONFIG)):.2f} at {side} px"
              for side in (512, 1024, 1328)]
    return ", ".join(shifts)
