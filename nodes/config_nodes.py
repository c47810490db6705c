"""LoRA and optimizer settings."""

from __future__ import annotations

from ..trainer_core.core.config import LoraConfig, OptimizerConfig
from .common import CATEGORY, LORA_CONFIG, OPTIMIZER_CONFIG
from .widgets import widgets


class QwenLoRAConfig:
    DESCRIPTION = ("LoRA settings: rank, alpha (free, the update is scaled by alpha / rank), dropout, target layers, "
                   "and the adapter type: LoRA, or LyCORIS' LoKr or LoHa (with LoKr's factor settings).")
    CATEGORY = CATEGORY
    FUNCTION = "build"
    RETURN_TYPES = (LORA_CONFIG,)
    RETURN_NAMES = ("lora_config",)
    OUTPUT_TOOLTIPS = ("Feeds Init Trainer.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": widgets(LoraConfig, "rank", "alpha", "dropout", "targets", "dtype", "adapter",
                                     "lokr_factor", "lokr_decompose_both")}

    def build(self, **settings):
        return (LoraConfig(**settings),)  # checked as it is made


class QwenLoRAOptimizer:
    DESCRIPTION = (
        "Optimizer and learning-rate schedule: 8-bit AdamW (bitsandbytes), AdamW, AdamW with Kahan summation "
        "(for bfloat16 LoRA weights), Prodigy, schedule-free AdamW, CAME or automagic; warm-up, constant or cosine "
        "schedule, gradient clipping; an EMA of the weights (off by default)."
    )
    CATEGORY = CATEGORY
    FUNCTION = "build"
    RETURN_TYPES = (OPTIMIZER_CONFIG,)
    RETURN_NAMES = ("optimizer_config",)
    OUTPUT_TOOLTIPS = ("Feeds Init Trainer.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": widgets(
            OptimizerConfig, "optimizer", "learning_rate", "beta1", "beta2", "eps", "weight_decay",
            "warmup_steps", "schedule", "schedule_steps", "min_lr_ratio", "max_grad_norm", "ema", "ema_decay",
        )}

    def build(self, **settings):
        return (OptimizerConfig(**settings),)  # checked as it is made
