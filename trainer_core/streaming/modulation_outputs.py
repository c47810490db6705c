"""The blocks' modulation outputs kept for later: for the checkpoint recompute, and computed ahead for the next
training forwards (modulation ahead).

A block's modulation Linears (img_mod.1, txt_mod.1: (B, D) -> (B, 6 D); Edit-2511's img_mod.1 (2B, D)) read
silu(temb), a function of the timestep alone, and need no gradient. Two uses follow:
- The recompute cache. A training forward under checkpointing keeps each block's outputs, and the block's
  checkpoint recompute takes them (the same values, bit for bit) instead of running the Linears again: they
  run once per step, and a streamed block's backward copy leaves their weights out.
- Modulation ahead. Given the timesteps (B,) of the next training forwards (`plan`), the first of them (a
  window's first) computes the streamed blocks' outputs for all of them while those blocks' whole blobs are on
  the GPU (`models.modulation.modulation_inputs`, each at its own forward's shapes, so the same kernels and
  values), and the others read them: their copies leave the modulation weights out
  (`placement.Ring.forward_needs_modulation`), a third of a block's bytes.
Keys are (block index, Linear name without peft's `.base_layer`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.modulation import modulation_inputs
from .placement import BACKWARD, FORWARD

Key = tuple[int, str]


class ModulationOutputs:
    """Both uses above for one model. The runner sets `phase` (the pass now running) at every block and
    `caching` around a training forward under checkpointing, calls `begin_forward` before block 0 and routes
    every modulation Linear through `output`."""

    def __init__(self, transformer: nn.Module, streamed: set[int]):
        self.transformer = transformer
        self.streamed = streamed  # modulation ahead serves these blocks only (the others' weights stay)
        self.phase = FORWARD
        self.caching = False
        self._cache: dict[Key, torch.Tensor] = {}  # the forward's outputs, for the recompute: (rows, 6 D)
        # Modulation ahead: the timesteps of the planned forwards not begun yet; per later forward of the window
        # its inputs and the streamed blocks' outputs; the forward now reading them; the forward now filling them
        # (its timesteps: the window's) and its own inputs.
        self._planned: list[torch.Tensor] = []
        self._ahead: list[PlannedForward] = []
        self._now: PlannedForward | None = None
        self._filling: list[torch.Tensor] | None = None
        self._fill_inputs: dict[str, torch.Tensor] | None = None
        self.forwards_from_plan = 0  # training forwards that took their streamed modulation outputs from a plan

    def plan(self, timesteps: list[torch.Tensor]) -> None:
        """The timesteps (B,) of the next training forwards, in order (see the module docstring)."""
        self.forget()
        self._planned = list(timesteps)

    def forget(self) -> None:
        """Drop what was planned or computed ahead."""
        self._planned, self._ahead, self._now, self._filling, self._fill_inputs = [], [], None, None, None

    def clear(self) -> None:
        """Drop everything kept, the recompute cache included."""
        self._cache.clear()
        self.forget()

    @property
    def planned_forwards(self) -> int:
        """Training forwards planned or computed ahead and not begun yet."""
        return len(self._planned) + len(self._ahead)

    def begin_forward(self, training_checkpointed: bool) -> tuple[bool, bool]:
        """Before block 0: is this forward a window's first (it computes the outputs ahead), a later one (it
        reads them), or neither (a preview's, a validation's, an unplanned one)? Returns (whether this forward
        needs the streamed blocks' modulation weights, whether the next one will), what the ring must know."""
        self._now = self._filling = self._fill_inputs = None
        if training_checkpointed:
            if self._ahead:
                self._now = self._ahead.pop(0)
                self.forwards_from_plan += 1
            elif self._planned:
                self._filling, self._planned = self._planned, []
                self._ahead = [PlannedForward(t) for t in self._filling[1:]]
        return self._now is None, not self._ahead

    def output(self, key: Key, forward, x: torch.Tensor) -> torch.Tensor:
        """A modulation Linear's output for input x (rows, D): the recompute takes the forward's, a planned
        forward the one computed ahead; otherwise the Linear's own `forward` runs."""
        if self.phase == BACKWARD and key in self._cache:
            return self._cache.pop(key)
        ahead = key[0] in self.streamed and self.phase == FORWARD
        if ahead and self._now is not None:  # computed by the window's first forward; the weights are not here
            y = self._now.take(key, x)
        else:
            y = forward(x)
            if ahead and self._filling is not None:
                self._fill_ahead(key, forward, x)
        if self.caching:
            self._cache[key] = y
        return y

    def _fill_ahead(self, key: Key, forward, x: torch.Tensor) -> None:
        """The window's first forward, at a streamed block's modulation Linear: its outputs for every later
        forward of the window, each computed alone (the shapes, hence the kernels and values, of that forward)."""
        if x.requires_grad:
            raise RuntimeError(f"modulation ahead: the input of block {key[0]}'s {key[1]} needs a gradient")
        if self._fill_inputs is None:  # first use in this forward: the inputs, once
            self._fill_inputs = modulation_inputs(self.transformer, self._filling[0], x.dtype)
            for entry in self._ahead:
                entry.inputs = modulation_inputs(self.transformer, entry.timestep, x.dtype)
        if x.device.type == "cpu":  # free here (no device sync): the plan matches this forward's timesteps
            PlannedForward.check(key, x, self._fill_inputs)
        with torch.no_grad():
            for entry in self._ahead:
                entry.outputs[key] = forward(entry.inputs[key[1]])


class PlannedForward:
    """One planned training forward: its timestep (B,), its modulation inputs {Linear name: (rows, D)} and
    the streamed blocks' modulation outputs {(block, Linear name): (rows, 6 D)}, taken as the forward runs."""

    def __init__(self, timestep: torch.Tensor):
        self.timestep = timestep
        self.inputs: dict[str, torch.Tensor] = {}
        self.outputs: dict[Key, torch.Tensor] = {}

    def take(self, key: Key, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":
            self.check(key, x, self.inputs)
        return self.outputs.pop(key)

    @staticmethod
    def check(key: Key, x: torch.Tensor, planned: dict[str, torch.Tensor]) -> None:
        if not torch.equal(x, planned[key[1]]):
            raise RuntimeError(f"modulation ahead: block {key[0]}'s {key[1]} got another input than planned (the "
                               "planned timesteps are not this forward's)")
