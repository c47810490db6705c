"""The caching phase's time on a named GPU: prompts encoded one forward each (data/cache.py encodes every prompt alone),
with the text encoder's streamed decoder layers copied through their ring as the transformer's blocks are.

    caching_time(inputs, parts, gpus.GPUS["rtx4090"], captions=100) -> CachingTime

The same model as the training timeline (timeline.py: `schedule` from the ring policy the swapper runs, `simulate` on
two streams), on the decoder alone: per layer, its Linears' matmul FLOPs at `inputs.text_tokens` + the chat template's
tokens, its attention, and for one-byte Linears kept their upcast's traffic; a streamed layer's copy is its weights
over the host link. Left out, as there: elementwise work, the embeddings, the vision tower (text-only prompts), the
VAE's encodes; so it is a floor for the phase, and streaming's share of it is on the safe side.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..streaming.placement import FORWARD, blob_layout, default_placement
from .caching import streamed_counts, streamed_layer_bytes
from .gpus import GpuProfile
from .inference import TEMPLATE_TOKENS, PartSizes
from .plan import PlanInputs
from .timeline import UPCAST_BYTES, Work, schedule, simulate


@dataclass(frozen=True)
class CachingTime:
    captions: int
    streamed_layers: int
    seconds: float  # all captions, the streamed layers copied per prompt
    resident_seconds: float  # the same with every layer on the GPU
    copy_bytes: int  # moved over the host link in all

    @property
    def seconds_per_caption(self) -> float:
        return self.seconds / self.captions


def layer_work(inputs: PlanInputs, parts: PartSizes) -> Work:
    """One decoder layer's forward on one prompt."""
    tokens = inputs.text_tokens + TEMPLATE_TOKENS
    linear = 2 * tokens * parts.text_layer_linear_params
    attention = 4 * tokens * tokens * parts.text_hidden  # q k^T and (softmax) v, all heads
    upcast = UPCAST_BYTES["float8"] * parts.text_layer_linear_params if inputs.text_encoder_storage == "float8" else 0
    return Work(linear + attention, 0, upcast)


def caching_time(inputs: PlanInputs, parts: PartSizes, gpu: GpuProfile, captions: int = 100) -> CachingTime:
    """Seconds to encode `captions` prompts of `inputs.text_tokens` tokens with `inputs.text_encoder_streamed` decoder
    layers streamed (spread over the depth, a ring of two), and with all of them resident (module docstring)."""
    decoder, _ = streamed_counts(inputs, parts)
    layer_bytes, _ = streamed_layer_bytes(inputs, parts)
    blob = blob_layout([layer_bytes], [False])
    work = {FORWARD: layer_work(inputs, parts)}
    passes = [FORWARD] * captions
    placement = default_placement(parts.text_layers, decoder) if decoder else None
    streamed = simulate(schedule(parts.text_layers, placement, passes, blob), work, gpu)
    resident = simulate(schedule(parts.text_layers, None, passes, blob), work, gpu)
    return CachingTime(captions, decoder, streamed.seconds, resident.seconds, streamed.copy_bytes)
