"""Engine edges reached from a caller's numbers: a negative count of text encoder layers to stream is refused by name
(it once reached the swapper as a ring of -1 slots and a raw IndexError), in the engine and in the memory plan."""

from __future__ import annotations

import pytest
import torch

from trainer_core.core.errors import UserInputError


def tiny_qwen3_vl():
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from trainer_core.families.qwen_image21.tiny import tiny_text_config

    config = tiny_text_config(64, {t: i for i, t in enumerate(("<|im_end|>", "<|endoftext|>", "<|image_pad|>",
                                                               "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"))})
    torch.manual_seed(0)
    return Qwen3VLForConditionalGeneration(Qwen3VLConfig(**config)).eval()


@pytest.mark.parametrize("stack", ["decoder", "vision"])
def test_a_negative_streamed_layer_count_is_refused_by_name_before_the_encoder_moves(stack):
    from trainer_core.streaming.encoder import EncoderStreams, StreamedLayers

    encoder = tiny_qwen3_vl()
    before = {n: p.clone() for n, p in encoder.state_dict().items()}
    with pytest.raises(UserInputError, match=rf"text encoder streaming: {stack}=-1 layers to stream is not a count\. "
                                             r"Use 0 \(all resident\)"):
        EncoderStreams.install(encoder, torch.device("cpu"), StreamedLayers(**{stack: -1}))
    assert all(torch.equal(before[n], p) for n, p in encoder.state_dict().items())  # untouched
    streams = EncoderStreams.install(encoder, torch.device("cpu"), StreamedLayers(**{stack: 99}))  # more: all of it
    streams.uninstall()


def test_the_plan_refuses_a_negative_streamed_layer_count_by_name():
    from trainer_core.planner import PlanInputs
    from trainer_core.planner.phases import plan_phases

    for name in ("text_encoder_streamed", "vision_streamed"):
        with pytest.raises(UserInputError, match=rf"{name}=-4: .* not negative"):
            plan_phases(PlanInputs(device="cuda", **{name: -4}))
