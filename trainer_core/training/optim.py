"""Optimizer and learning-rate schedule builders.

Every optimizer comes from a kept library except automagic, which no kept library has (automagic.py). The
memory plan's figure for each optimizer's state is in planner/optimizer_state.py; tests hold it to
`optimizer_state_bytes` below, measured on the built optimizer.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch

from ..core.config import OptimizerConfig, to_dict
from ..core.errors import UserInputError

# optimizer name -> the pip package that provides it (all pure-Python wheels; requirements.txt lists them).
PACKAGES = {"adamw8bit": "bitsandbytes", "prodigy": "prodigyopt", "schedulefree_adamw": "schedulefree",
            "came": "came-pytorch", "adamw_kahan": "torch-optimi"}
# CAME's two regularisers (its paper's values: Luo et al. 2023, CAME, §4) and its third beta, for the
# confidence of the update; our `eps` is Adam's and does not apply to CAME.
CAME_EPS = (1e-30, 1e-16)
CAME_BETA3 = 0.9999


def _library(optimizer: str, module: str):
    try:
        return import_bitsandbytes() if module == "bitsandbytes" else __import__(module)
    except ImportError:
        raise UserInputError(
            f"optimizer {optimizer!r} needs the package {PACKAGES[optimizer]!r}, which is not installed in this "
            f"Python: run `pip install {PACKAGES[optimizer]}` (or `pip install -r requirements.txt` in this pack's "
            "folder) with the Python that runs ComfyUI, or choose another optimizer.") from None


def build_optimizer(params: list[torch.nn.Parameter], cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """The optimizer `cfg.optimizer` names, over `params`, with decoupled weight decay (config.py's help text
    says what each is for)."""
    name, lr, betas, wd = cfg.optimizer, cfg.learning_rate, (cfg.beta1, cfg.beta2), cfg.weight_decay
    if name == "adamw8bit":
        return _library(name, "bitsandbytes").optim.AdamW8bit(params, lr=lr, betas=betas, eps=cfg.eps, weight_decay=wd)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=cfg.eps, weight_decay=wd)
    if name == "adamw_kahan":
        # kahan_sum=None: optimi turns Kahan summation on for bfloat16/float16 weights only (float32 weights
        # keep small updates already, and the buffer would cost memory for nothing).
        return _library(name, "optimi").AdamW(params, lr=lr, betas=betas, eps=cfg.eps, weight_decay=wd,
                                               kahan_sum=None)
    if name == "prodigy":
        # Prodigy estimates the step size d itself; lr multiplies it (1.0 as its authors advise). With a
        # warm-up, safeguard_warmup keeps the small warm-up rates from inflating the estimate (its README).
        return _library(name, "prodigyopt").Prodigy(params, lr=lr, betas=betas, eps=cfg.eps, weight_decay=wd,
                                                    decouple=True, safeguard_warmup=cfg.warmup_steps > 0)
    if name == "schedulefree_adamw":
        optimizer = _library(name, "schedulefree").AdamWScheduleFree(params, lr=lr, betas=betas, eps=cfg.eps,
                                                                     weight_decay=wd, warmup_steps=0)
        optimizer.train()  # it steps only in train mode; `evaluation_weights` switches around previews and saves
        return optimizer
    if name == "came":
        return _library(name, "came_pytorch").CAME(params, lr=lr, betas=(*betas, CAME_BETA3), eps=CAME_EPS,
                                                   weight_decay=wd)
    if name == "automagic":
        from .automagic import Automagic

        return Automagic(params, lr=lr, weight_decay=wd)
    raise UserInputError(f"optimizer {name!r} is not one of {sorted([*PACKAGES, 'adamw', 'automagic'])}.")


def is_schedule_free(optimizer: torch.optim.Optimizer | None) -> bool:
    return optimizer is not None and "train_mode" in optimizer.param_groups[0] and hasattr(optimizer, "eval")


@contextlib.contextmanager
def evaluation_weights(optimizer: torch.optim.Optimizer | None) -> Iterator[None]:
    """Inside: the LoRA weights are the ones the optimizer evaluates at. Only schedule-free AdamW differs:
    it trains at an interpolation y of its average x and its iterate z, and a preview, validation or saved LoRA
    must see x. On leaving, the training weights are put back exactly as they were, copied and not recomputed
    (the library's train() recomputes y from x with a rounding), so a preview changes nothing later steps see."""
    if not is_schedule_free(optimizer) or not optimizer.param_groups[0]["train_mode"]:
        yield
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    kept = [p.detach().clone() for p in params]
    optimizer.eval()
    try:
        yield
    finally:
        with torch.no_grad():
            for p, k in zip(params, kept):
                p.copy_(k)
        for group in optimizer.param_groups:
            group["train_mode"] = True


# What a resume means for each parameter-group entry (an optimizer's hyper-parameters live in its groups, and torch's
# load_state_dict restores the saved groups whole). The entries below are the optimizer's own running values, not
# settings: the checkpoint's are kept. Every other entry is a setting: the resumed optimizer takes it from the current
# settings (as `build_optimizer` made it), so a changed beta, eps, weight decay or Prodigy's warm-up safeguard
# applies from the resumed step on. The learning rate is set before every step anyway (`set_learning_rate`).
RUNNING_GROUP_VALUES = {
    # optimi keeps its step count in the group, and its first step decides kahan_sum, triton and foreach where they
    # were left to it (None): our settings leave them, so the checkpoint's decisions stand
    "adamw_kahan": ("step", "setup", "kahan_sum", "triton", "foreach"),
    "prodigy": ("d", "d_max", "d_numerator", "d_denom", "d_hat", "k"),  # its step-size estimate d, its step count
    "schedulefree_adamw": ("k", "weight_sum", "lr_max", "scheduled_lr", "train_mode"),  # the average's weights
    # the rate its per-value rates started at: a new learning_rate scales them by new / this (set_learning_rate)
    "automagic": ("initial_lr",),
}


def load_state(optimizer: torch.optim.Optimizer, state_dict: dict, name: str) -> None:
    """`optimizer.load_state_dict` for optimizer `name` (built from the current settings), keeping each state
    tensor's saved dtype and the current settings' group entries (RUNNING_GROUP_VALUES). torch casts floating state
    to its parameter's dtype while loading; CAME's and automagic's float32 state of a bfloat16 LoRA would be rounded,
    and the resumed run would differ from the uninterrupted one."""
    settings = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(state_dict)
    running = RUNNING_GROUP_VALUES.get(name, ())
    for group, current in zip(optimizer.param_groups, settings):
        group.update({k: v for k, v in current.items() if k not in running})
    saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, p in zip(saved_ids, params):
        for key, value in state_dict["state"].get(index, {}).items():
            loaded = optimizer.state[p].get(key)
            if torch.is_tensor(value) and torch.is_tensor(loaded) and loaded.dtype != value.dtype:
                optimizer.state[p][key] = value.to(loaded.device, copy=True)


def fixed_for_the_run(saved: dict, now: OptimizerConfig, then: str = "checkpoint") -> list[str]:
    """The settings a run cannot continue across (each 'name: <then> X, now Y'), between `saved` (a checkpoint's
    or a live trainer's optimizer settings, as a dict) and `now`. The optimizer kind (its state means nothing to
    another), and schedule-free AdamW's beta1: its training weights are the interpolation of its average and its
    iterate by beta1, so another beta1 would make another average of the same weights."""
    fixed = ["optimizer"] + (["beta1"] if now.optimizer == "schedulefree_adamw" else [])
    return [f"{key}: {then} {saved[key]!r}, now {getattr(now, key)!r}" for key in fixed
            if key in saved and saved[key] != getattr(now, key)]


def changed_settings(saved: dict, now: OptimizerConfig) -> list[str]:
    """The optimizer settings a resume applies anew ('weight_decay 0.01 -> 0.1'), in the settings' order."""
    return [f"{key} {saved[key]!r} -> {value!r}" for key, value in to_dict(now).items()
            if key in saved and saved[key] != value]


def import_bitsandbytes():
    """bitsandbytes (its one misleading import message is filtered by core/quiet.py, installed with the package)."""
    import bitsandbytes

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
    schedule applies from the resumed step on. (Prodigy multiplies its own step size by it; automagic its
    per-value rates, by the ratio to the starting learning rate.)
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
