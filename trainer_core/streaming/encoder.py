"""Streaming a text encoder through the device while caching: its decoder layers (and its vision tower's blocks) whose
frozen Linear weights do not fit the GPU stay in host memory and are copied to a ring of device slots right before
each runs, as the transformer's streamed blocks are (`swapper.BlockSwapper`, `placement.Ring`), forward only.

    streams = EncoderStreams.install(encoder, device, StreamedLayers(decoder=20, vision=0))
    ... encode prompts (any number of forwards) ...
    streams.uninstall()           # masters back into the modules, the pinned arena freed with them

The stacks are the ones transformers' Qwen2.5-VL and Qwen3-VL share: `model.language_model.layers` (the decoder) and
`model.visual.blocks` (the vision tower, where the encoder has one). A stack's streamed layers are spread over its
depth (`placement.default_placement`), so the resident layers between them hide the copies on a GPU. Everything else
(embeddings, norms, biases, the rotary tables, the vision tower's patch embedding and merger, every resident layer) is
moved to the device. The values are the same wherever a weight comes from: an encoder streamed on the CPU encodes,
bit for bit, what it encodes resident (tests/engine/test_encoder_streaming.py).

Host memory: a streamed Linear's weight is read from the file into host memory (the loaders' `device_for`), then
packed into the swapper's arena (pinned on CUDA) one tensor at a time, the original freed before the next: the host
holds the streamed masters once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from ..models.float8 import frozen_linears
from . import forwards
from .placement import FORWARD, default_placement
from .swapper import BlockSwapper


@dataclass(frozen=True)
class StreamedLayers:
    """How many of the encoder's decoder layers and vision blocks stream (0: all resident; more than a stack has: all
    of it)."""

    decoder: int = 0
    vision: int = 0

    def __post_init__(self) -> None:
        # A negative count would reach the swapper as a ring of -1 slots (a raw IndexError at the first layer).
        from ..core.errors import UserInputError

        for name in ("decoder", "vision"):
            count = getattr(self, name)
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise UserInputError(
                    f"text encoder streaming: {name}={count!r} layers to stream is not a count. Use 0 (all resident) "
                    f"or a whole number of {name} layers to stream from host memory (more than the encoder has: all).")

    @property
    def any(self) -> bool:
        return bool(self.decoder or self.vision)

    def describe(self, stacks: dict[str, int]) -> str:
        """One phrase for the cache's status, given each stack's layer count."""
        if not self.any:
            return "text encoder resident on the device"
        parts = [f"{self.decoder} of {stacks['decoder']} decoder layers"] if self.decoder else []
        parts += [f"{self.vision} of {stacks['vision']} vision blocks"] if self.vision else []
        return f"text encoder streamed: {' and '.join(parts)} from host memory"


def encoder_stacks(encoder: nn.Module) -> dict[str, nn.ModuleList]:
    """The stacks that may stream, by name: the decoder's layers, and the vision tower's blocks when it has one."""
    inner = encoder.model
    stacks = {"decoder": inner.language_model.layers}
    if getattr(inner, "visual", None) is not None:
        stacks["vision"] = inner.visual.blocks
    return stacks


def streamed_weight_names(encoder: nn.Module, streamed: StreamedLayers, prefix: str = "") -> set[str]:
    """The parameter names (`prefix` + name in the encoder) of the streamed layers' frozen Linear weights: what a
    loader reads into host memory instead of the device."""
    names = set()
    for stack_name, count in (("decoder", streamed.decoder), ("vision", streamed.vision)):
        stacks = encoder_stacks(encoder)
        if not count or stack_name not in stacks:
            continue
        stack = stacks[stack_name]
        stack_path = _path_of(encoder, stack)
        for i in default_placement(len(stack), min(count, len(stack))).streamed:
            names |= {f"{prefix}{stack_path}.{i}.{n}.weight" for n, _ in frozen_linears(stack[i])}
    return names


def _path_of(root: nn.Module, module: nn.Module) -> str:
    return next(name for name, m in root.named_modules() if m is module)


class _Stream:
    """One stack's streaming: the swapper over its streamed layers, and a wrapper on every layer's forward."""

    def __init__(self, layers: nn.ModuleList, count: int, device: torch.device):
        self.layers = layers
        self.swapper = BlockSwapper(layers, default_placement(len(layers), count), device)
        for i, layer in enumerate(layers):
            layer.forward = forwards.wrap(layer.forward, functools.partial(self._run, i), self)

    def _run(self, i: int, forward, *args, **kwargs):
        self.swapper.before(FORWARD, i)
        return forward(*args, **kwargs)

    def uninstall(self) -> None:
        self.swapper.release()
        for layer in self.layers:
            forwards.unwrap(layer)


class EncoderStreams:
    """The streams installed on one encoder (see the module docstring)."""

    def __init__(self, streams: list[_Stream]):
        self.streams = streams

    @classmethod
    def install(cls, encoder: nn.Module, device: torch.device, streamed: StreamedLayers) -> EncoderStreams:
        """Move `encoder` to `device` but for its streamed layers' frozen Linear weights (left where they are: host
        memory), and stream those through a ring of slots on every forward."""
        stacks = encoder_stacks(encoder)
        counts = {"decoder": streamed.decoder, "vision": streamed.vision if "vision" in stacks else 0}
        counts = {name: min(count, len(stacks[name])) for name, count in counts.items() if count}  # at most all
        kept: dict[nn.Linear, torch.Tensor] = {}
        for name, count in counts.items():
            if count:
                layers = stacks[name]
                for i in default_placement(len(layers), count).streamed:
                    for _, linear in frozen_linears(layers[i]):
                        kept[linear] = linear.weight.data
                        linear.weight.data = torch.empty(0, dtype=linear.weight.dtype)
        encoder.to(device)
        for linear, weight in kept.items():
            linear.weight.data = weight
        kept.clear()  # else these references keep every original alive while the swappers pack them into their arenas
        return cls([_Stream(stacks[name], count, device) for name, count in counts.items()])

    @property
    def bytes_copied(self) -> int:
        return sum(s.swapper.bytes_copied for s in self.streams)

    def uninstall(self) -> None:
        for stream in self.streams:
            stream.uninstall()
        self.streams = []
