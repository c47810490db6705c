"""The per-instance forwards the block runner puts on the blocks and their modulation Linears, and takes off.

A wrapper is an instance attribute `forward` (so module names, state dict keys and the diffusers forward and
pipeline stay untouched) that calls `ours(original, *args, **kwargs)`. It names its runner outright, so that a
runner left installed (its trainer dropped without close(): its wrappers keep it alive) can be found and
taken out (`installed_runners`). Digging the runner out of the wrapper's layers does not work: partial()
flattens a partial of a partial (issue 25: AttributeError: 'function' object has no attribute 'func').
"""

from __future__ import annotations

import functools

from torch import nn

from ..models.float8 import frozen_linears


def wrap(forward, ours, runner) -> functools.partial:
    """`ours` called with the module's own forward first (unwrapping one a previous runner left)."""
    original = forward.__wrapped_forward__ if is_ours(forward) else forward
    wrapped = functools.partial(ours, original)
    wrapped.__wrapped_forward__ = original
    wrapped.__block_runner__ = runner
    return wrapped


def unwrap(module: nn.Module, attr: str = "forward") -> None:
    """The module's forward as it was before `wrap`: the instance attribute it found, or the class's own."""
    forward = module.__dict__.get(attr)
    if is_ours(forward):
        original = forward.__wrapped_forward__
        if getattr(original, "__self__", None) is module and getattr(original, "__func__", None) is getattr(
                type(module), attr, None):
            del module.__dict__[attr]  # it was the class's own method
        else:
            setattr(module, attr, original)


def installed_runners(transformer: nn.Module) -> list:
    """The runners whose wrappers are on any block of `transformer` or on any of its frozen Linears, in order."""
    runners = []
    for block in transformer.transformer_blocks:
        for module in (block, *(lin for _, lin in frozen_linears(block))):
            forward = module.__dict__.get("forward")
            if is_ours(forward) and not any(r is forward.__block_runner__ for r in runners):
                runners.append(forward.__block_runner__)
    return runners


def is_ours(forward) -> bool:
    return isinstance(forward, functools.partial) and hasattr(forward, "__block_runner__")
