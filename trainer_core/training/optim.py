"""Optimizer and learning-rate schedule builders."""

from __future__ import annotations

import logging
import math

import torch

from ..core.config import OptimizerConfig


def build_optimizer(params: list[torch.nn.Parameter], cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """bitsandbytes AdamW8bit (state in 8 bits: 1/4 of AdamW's) or torch AdamW, decoupled weight decay."""
    kwargs = dict(lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw8bit":
        return import_bitsandbytes().optim.AdamW8bit(params, **kwargs)
    return torch.optim.AdamW(params, **kwargs)


class _Not4BitKernel(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "gemm_4bit_forward" not in record.getMessage()


def import_bitsandbytes():
    """bitsandbytes, without the warning its import logs on some CPUs when the optional `kernels` package is absent
    ("Failed to load CPU gemm_4bit_forward from kernels-community"): that kernel is its 4-bit matmul, which 8-bit
    AdamW never uses, and the warning read like an error at the first step. Every other message still shows."""
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    quiet = _Not4BitKernel()
    logger.addFilter(quiet)
    try:
        import bitsandbytes
    finally:
        logger.removeFilter(quiet)
    return bitsandbytes


def lr_factor(step: int, cfg: OptimizerConfig) -> float:
    """Multiplier of the learning rate for optimizer step `step` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(1, cfg.schedule_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: torch.optim.Optimizer, cfg: OptimizerConfig, step: int) -> float:
    """Set the learning rate for optimizer step `step` (0-based) and return it.

    The schedule is a pure function of the step, so resuming needs no scheduler state and a changed
    schedule applies from the resumed step on.
    """
    lr = cfg.learning_rate * lr_factor(step, cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes held by the optimizer's per-parameter state tensors, each storage counted once.

    bitsandbytes' 8-bit optimizers put the same two quantisation maps (2 KiB) into every parameter's
    state; counting them per parameter would add 2 KiB per LoRA tensor that is not there.
    """
    storages: dict[tuple[str, int], int] = {}
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                st = value.untyped_storage()
                storages[(str(value.device), st.data_ptr())] = st.nbytes()
    return sum(storages.values())
