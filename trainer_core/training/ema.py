"""An exponential moving average (EMA) of the adapter's weights, kept beside the weights that train.

    average <- decay_n * average + (1 - decay_n) * weights      after every optimizer step n = 0, 1, 2, ...
    decay_n  = min(ema_decay, (1 + n) / (10 + n))

The warm-up of decay_n is OneTrainer's and ai-toolkit's (torch_ema's `use_num_updates`): without it an average
started at a fresh LoRA (B = 0) would hold the untrained adapter for the first ~1/(1 - decay) steps. ema_decay 0
makes the average the weights themselves, exactly. The update is torch's own EMA step
(`torch.optim.swa_utils.get_ema_multi_avg_fn`, one fused lerp over every LoRA tensor).

The average is float32 on the weights' device whatever the LoRA dtype (a bfloat16 average would round away the
(1 - decay) share of each step), so it costs 4 bytes per LoRA value there; the memory plan counts it. The
LoRA's weights stay on the GPU under block streaming (only frozen weights are streamed), so the average does too.

Checkpoints hold it (`ema.<param name>` tensors and the update count), so a resumed run continues it bit-exactly;
a checkpoint written without EMA starts the average at its weights (`resume_note`). LoRA files, previews and
the validation loss read the average only inside `averaged_weights`, which puts the raw weights back exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.optim.swa_utils import get_ema_multi_avg_fn

from ..core.errors import UserInputError

WEIGHTS = ("raw", "ema")  # what a LoRA file or a preview is made from
TENSOR_PREFIX = "ema."  # checkpoint tensors: ema.<param name>


def ema_decay_at(decay: float, updates: int) -> float:
    """The decay of update number `updates` (0-based): `decay`, less while few updates were made."""
    return min(decay, (1 + updates) / (10 + updates))


class WeightAverage:
    """The EMA of `params` (the trainer's LoRA parameters, in their order), starting at their values now."""

    def __init__(self, params: list[torch.nn.Parameter], decay: float):
        self.params, self.decay, self.updates = params, decay, 0
        self.averages = [p.detach().to(torch.float32, copy=True) for p in params]

    @torch.no_grad()
    def update(self) -> None:
        """One EMA step towards the weights as they are now (call after each optimizer step)."""
        step = get_ema_multi_avg_fn(ema_decay_at(self.decay, self.updates))
        step(self.averages, [p.detach().float() for p in self.params], self.updates)
        self.updates += 1

    @torch.no_grad()
    def restart(self) -> None:
        """Start again at the weights as they are now (a checkpoint without an average was resumed)."""
        for average, p in zip(self.averages, self.params):
            average.copy_(p.detach())
        self.updates = 0

    def state(self, param_names: list[str]) -> tuple[dict[str, torch.Tensor], dict]:
        """(tensors, JSON-able metadata) for a checkpoint."""
        return ({f"{TENSOR_PREFIX}{n}": a for n, a in zip(param_names, self.averages)},
                {"updates": self.updates, "decay": self.decay})

    @torch.no_grad()
    def load(self, param_names: list[str], tensors: dict[str, torch.Tensor], meta: dict) -> None:
        for name, average in zip(param_names, self.averages):
            average.copy_(tensors[f"{TENSOR_PREFIX}{name}"])
        self.updates = meta["updates"]


def build_average(params: list[torch.nn.Parameter], optimizer_cfg) -> WeightAverage | None:
    return WeightAverage(params, optimizer_cfg.ema_decay) if optimizer_cfg.ema else None


def resume_note(step: int) -> str:
    return (f"the checkpoint of step {step} was written without EMA: the EMA of the weights starts at the weights "
            f"of step {step}.")


@contextlib.contextmanager
def averaged_weights(average: WeightAverage | None, params, run_name: str, weights: str) -> Iterator[None]:
    """Inside: the LoRA `params` hold `weights` ('raw': unchanged; 'ema': the `average`, cast to the LoRA dtype). On
    leaving, the raw weights are put back from a copy, bit for bit, so a preview or save changes no later step.
    `run_name` names the run whose average is asked for where it keeps none."""
    if weights not in WEIGHTS:
        raise UserInputError(f"weights={weights!r}: expected one of {list(WEIGHTS)}.")
    if weights == "raw":
        yield
        return
    if average is None:
        raise UserInputError(
            f"weights 'ema' asked for, but run '{run_name}' keeps no EMA of its weights: turn on "
            "ema in the Optimizer node (or [optimizer] ema = true in a run file), or choose weights 'raw'.")
    kept = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for p, a in zip(params, average.averages):
                p.copy_(a)
        yield
    finally:
        with torch.no_grad():
            for p, k in zip(params, kept):
                p.copy_(k)


def ema_path(path: str | Path) -> Path:
    """Where the EMA file of LoRA file `path` goes: `name_ema.safetensors` beside `name.safetensors`."""
    path = Path(path)
    return path.with_name(f"{path.stem}_ema{path.suffix}")
