"""The kind of value each diffusion-pipe field takes, checked as the importer (diffusion_pipe.py) reads it.

Without this a text where a number belongs failed inside a conversion with an error naming no field, and a
fraction where a whole number belongs (micro_batch_size_per_gpu = 1.5) was cut to a whole number without a
word. Each wrong value is refused naming the file, the field and what it takes.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import UserInputError

WHOLE = frozenset({
    "epochs", "max_steps", "image_micro_batch_size_per_gpu", "gradient_accumulation_steps", "warmup_steps",
    "save_every_n_epochs", "save_every_n_steps", "save_every_n_examples", "caching_batch_size", "adapter.rank",
    "num_repeats",
})
NUMBER = frozenset({
    "adapter.alpha", "adapter.dropout", "optimizer.lr", "optimizer.eps", "optimizer.beta2_half_life",
    "optimizer.weight_decay", "gradient_clipping", "force_constant_lr", "uncond_fraction", "model.sigmoid_scale",
})


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_kind(source: str, name: str, value: Any) -> None:
    """Refuse `value` of field `name` (as diffusion-pipe names it: 'x' or 'table.x') when it is not of the field's
    kind; `source` names the file ("diffusion-pipe config X"). None (a field left out) passes."""
    if value is None:
        return
    if name == "micro_batch_size_per_gpu":  # a whole number, or [[resolution, batch size], ...]
        if _whole(value) or (isinstance(value, list) and value and all(
                isinstance(pair, list) and len(pair) == 2 and _whole(pair[1]) for pair in value)):
            return
        raise UserInputError(f"{source}: micro_batch_size_per_gpu = {value!r} must be a whole number (for example 1), "
                             "or a list of [resolution, batch size] pairs with whole batch sizes. Fix it in the config.")
    if name in WHOLE and not _whole(value):
        raise UserInputError(f"{source}: {name} = {value!r} must be a whole number. Fix it in the config.")
    if name in NUMBER and not _number(value):
        raise UserInputError(f"{source}: {name} = {value!r} must be a number (no quotes). Fix it in the config.")
