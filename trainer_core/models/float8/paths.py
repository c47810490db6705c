"""The compute paths of the frozen float8 block Linears, behind one interface: pick one by name, install it on
the Linears, read one line of status, uninstall it.

    path = compute_path(EAGER | FP8_ACTIVATIONS | COMPILED | INT8)   (`path_name(...)` from the training options)
    installed = path.install(linears, device)                     -> Installed
    installed.name       the path that runs: EAGER where the one asked for cannot run on this device
    installed.status     one line for the run's status, or None (the eager path says nothing)
    installed.uninstall()  the Linears' forwards as they were

The paths, and where each lives:
- EAGER (`storage.FrozenLinearFunction`): upcast the stored weight to the activations' dtype on every call and
  multiply there. Installed by the storage itself (`storage.install_frozen_compute`), so installing it here
  changes nothing: it is what the others fall back to.
- FP8_ACTIVATIONS (`activations`): quantise the activation and multiply float8 x float8 with
  `torch._scaled_mm`, where the device runs it and the weights are stored in float8.
- COMPILED (`compiled`): the upcast compiled into the matmul (CUDA + Triton; the CPU only when asked).
- INT8 (`models/int8_compute.py`): int8 activations by int8 weights with `torch._int_mm`, on every device; the
  weights must be held in int8 first (an int8 ConvRot file's are; `int8_compute.store_int8` converts the others).
The alternatives replace a Linear's forward (an instance attribute) and give back the one they found.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .. import int8_compute
from . import activations, compiled
from .storage import FLOAT8, restore_forwards

EAGER, FP8_ACTIVATIONS, COMPILED, INT8 = "eager", "fp8_activations", "compiled", "int8"


def path_name(compile_float8: bool = False, fp8_activations: bool = False, int8_compute: bool = False) -> str:
    """The path the training options ask for. They are alternatives: two at once is refused."""
    if compile_float8 + fp8_activations + int8_compute > 1:
        raise ValueError("compile_float8, fp8_activations and int8_compute are alternatives; choose one")
    return COMPILED if compile_float8 else FP8_ACTIVATIONS if fp8_activations else INT8 if int8_compute else EAGER


@dataclass
class Installed:
    """A path installed on some Linears: which runs, its status line, and the forwards it replaced."""

    name: str
    status: str | None = None
    previous: dict[nn.Linear, object] = field(default_factory=dict)

    def uninstall(self) -> None:
        restore_forwards(self.previous)
        self.previous = {}


class _Eager:
    name = EAGER

    def install(self, linears: list[nn.Linear], device: torch.device) -> Installed:
        return Installed(EAGER)


class _Fp8Activations:
    name = FP8_ACTIVATIONS

    def install(self, linears: list[nn.Linear], device: torch.device) -> Installed:
        stored_float8 = any(lin.weight.dtype == FLOAT8 for lin in linears)
        scaling = activations.scaling_for(device) if stored_float8 else None
        previous = activations.install(linears, scaling) if scaling is not None else {}
        status = activations.status(len(previous), len(linears), scaling, stored_float8)
        return Installed(FP8_ACTIVATIONS if previous else EAGER, status, previous)


class _Compiled:
    name = COMPILED

    def __init__(self, allow_cpu: bool = False):
        self.allow_cpu = allow_cpu  # tests and benchmarks (see compiled.available)

    def install(self, linears: list[nn.Linear], device: torch.device) -> Installed:
        if not compiled.available(device, allow_cpu=self.allow_cpu):
            return Installed(EAGER)
        return Installed(COMPILED, None, compiled.install(linears))


class _Int8:
    name = INT8

    def install(self, linears: list[nn.Linear], device: torch.device) -> Installed:
        previous = int8_compute.install(linears, device)
        return Installed(INT8 if previous else EAGER, int8_compute.status(len(previous), len(linears)), previous)


def compute_path(name: str, allow_cpu: bool = False):
    """The path called `name` (EAGER, FP8_ACTIVATIONS, COMPILED, INT8). `allow_cpu`: the compiled path on the CPU too."""
    if name == COMPILED:
        return _Compiled(allow_cpu)
    paths = {EAGER: _Eager, FP8_ACTIVATIONS: _Fp8Activations, INT8: _Int8}
    if name not in paths:
        raise ValueError(f"unknown float8 compute path {name!r}; expected one of {(EAGER, FP8_ACTIVATIONS, COMPILED, INT8)}")
    return paths[name]()
