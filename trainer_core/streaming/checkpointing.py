"""One block's training forward: under activation checkpointing or not, and marked so that the runner hears
when the backward reaches the block (there the swapper brings the block's weights back).

A block's outputs are (text (B, N_txt, D), image (B, N_img, D)).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.utils.checkpoint


def checkpointed(forward: Callable, *args, **kwargs) -> tuple[torch.Tensor, ...]:
    """`forward(*args, **kwargs)` whose activations are recomputed in backward instead of kept. Non-reentrant:
    it works with keyword arguments, with inputs that need no gradient, and with the backward mark below."""
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def without_dead_text_stream(outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The last block's outputs with the text stream detached: the model uses only the image stream of the last
    block, so no backward runs through the text stream's dead half on zero gradients."""
    return (outputs[0].detach(), *outputs[1:])


def marked_for_backward(outputs: tuple[torch.Tensor, ...], before_backward: Callable[[], None]) -> tuple:
    """`outputs`, those that need a gradient passed through `BackwardMark`: `before_backward()` runs once, right
    before gradients enter the block (and before its checkpoint recompute)."""
    live = [k for k, o in enumerate(outputs) if o.requires_grad]
    if not live:
        return outputs
    marked = iter(BackwardMark.apply(before_backward, *(outputs[k] for k in live)))
    return tuple(next(marked) if k in live else o for k, o in enumerate(outputs))


class BackwardMark(torch.autograd.Function):
    """Identity whose backward calls `before_backward()` before gradients enter the block."""

    @staticmethod
    def forward(ctx, before_backward, *outputs):
        ctx.before_backward = before_backward
        return tuple(o.view_as(o) for o in outputs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.before_backward()
        return (None, *grads)
