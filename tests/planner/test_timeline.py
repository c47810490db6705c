"""The timeline model against a real step: the copies, waits and block computes that `streaming.runner.BlockRunner`
issues while a tiny model trains equal, event for event and byte for byte, the schedule
`planner.timeline.schedule` predicts; and the model's predictions behave as the hardware figures say."""

import dataclasses

import pytest
import torch

from trainer_core.core.config import LoraConfig
from trainer_core.devtools.random_weights import random_transformer
from trainer_core.adapters.lora import inject_lora
from trainer_core.training.objective import flow_loss
from trainer_core.streaming.runner import BlockRunner
from trainer_core.planner import PlanInputs, arch_from_transformer
from trainer_core.planner.arch import real_arch
from trainer_core.planner.plan import block_blob
from trainer_core.planner.timeline import FP8_PATH, GPUS, ComputePath, predict, schedule
from trainer_core.streaming.placement import BACKWARD, FORWARD, spread_placement, tail_placement

# A real Qwen-Image layout (16 latent channels, 2x2 patches) at toy width, 6 blocks.
TINY = dict(num_layers=6, num_attention_heads=2, attention_head_dim=16, axes_dims_rope=(8, 4, 4), joint_attention_dim=32)


def train_steps(model, steps: int) -> None:
    g = torch.Generator().manual_seed(0)
    grid, text = 4, 8
    for _ in range(steps):
        x = torch.randn(1, grid * grid, 64, generator=g)  # (B, packed latent tokens, 4 x 16 channels)
        prompt = torch.randn(1, text, 32, generator=g)  # (B, text tokens, joint dim)
        prediction = model(hidden_states=x, encoder_hidden_states=prompt, timestep=torch.tensor([0.5]),
                           img_shapes=[[(1, grid, grid)]], return_dict=False)[0]
        flow_loss(prediction, torch.randn(1, grid * grid, 64, generator=g)).backward()


@pytest.mark.parametrize("placement, checkpointing", [
    (spread_placement(6, 5, ring=2), True),
    (spread_placement(6, 5, ring=3), False),
    (tail_placement(6, 4, ring=2), True),
])
def test_a_real_step_issues_the_schedule_the_model_predicts(placement, checkpointing):
    model = random_transformer(TINY, storage="float8", compute_dtype=torch.float32)
    inject_lora(model, LoraConfig(rank=4, alpha=4.0, targets="all"), seed=0)
    runner = BlockRunner(model, torch.device("cpu"), checkpointing=checkpointing, placement=placement)
    events, swapper = runner.record(), runner.swapper
    train_steps(model, 3)
    runner.uninstall()
    predicted = schedule(6, placement, [FORWARD, BACKWARD] * 3, block_blob(arch_from_transformer(model), "float8"))
    assert events == predicted
    copies = [e for e in events if e[0] == "copy"]
    assert sum(e[2] for e in copies) == swapper.bytes_copied
    # Streamed blocks' backward copies leave the modulation Linears out (their outputs come from the forward):
    # the copy would have failed loudly had the recompute or a backward needed them.
    blob = block_blob(arch_from_transformer(model), "float8")
    assert {e[2] for e in copies} <= {blob.whole_bytes, blob.backward_bytes, blob.tail_bytes}
    assert blob.backward_bytes < blob.whole_bytes
    if len(placement.streamed) > 2 * placement.ring:  # some block is copied back for the backward alone
        assert ("copy", placement.streamed[placement.ring], blob.backward_bytes) in copies


def test_the_last_blocks_text_stream_runs_no_backward():
    """Its output is thrown away by the model: no gradient reaches its text-stream feed-forward."""
    model = random_transformer(dict(TINY, num_layers=2), storage="float8", compute_dtype=torch.float32)
    inject_lora(model, LoraConfig(rank=4, alpha=4.0, targets="attention+mlp"), seed=0)
    calls = {0: 0, 1: 0}
    for i, block in enumerate(model.transformer_blocks):
        block.txt_mlp.net[2].register_full_backward_pre_hook(lambda m, g, i=i: calls.__setitem__(i, calls[i] + 1))
    runner = BlockRunner(model, torch.device("cpu"), checkpointing=False)
    train_steps(model, 1)
    runner.uninstall()
    assert calls == {0: 1, 1: 0}


def test_predictions_follow_the_hardware():
    """Slower links cost more; all-resident costs nothing; spreading the streamed blocks beats the tail."""
    inputs = PlanInputs(width=1024, height=1024, rank=32, blocks_to_swap=29, modulation_ahead=False)
    fast, slow = predict(inputs, GPUS["rtx4090"]), predict(inputs, GPUS["rtx4090-pcie3"])
    assert fast.resident_seconds == slow.resident_seconds and fast.seconds <= slow.seconds
    assert predict(dataclasses.replace(inputs, blocks_to_swap=0), GPUS["h100"]).overhead == 0
    tail = predict(inputs, GPUS["h100"], tail_placement(60, 29))
    assert predict(inputs, GPUS["h100"]).seconds < tail.seconds
    # A steady step, 29 streamed, ring of 2: the forward finds the first 2 in the ring and copies 27 whole; the
    # backward finds the last 2, copies 25 without their modulation Linears and the first 2 whole (they stay
    # in the ring for the next forward).
    blob = block_blob(real_arch(), "float8")
    assert fast.copy_bytes == 27 * blob.whole_bytes + 25 * blob.backward_bytes + 2 * blob.whole_bytes
    # With modulation ahead, a window of 16 steps: the first forward copies 27 whole, every other pass 27
    # backward parts, except the window's last backward: 25 backward parts and the first 2 whole for the next
    # window's first forward.
    ahead = predict(dataclasses.replace(inputs, modulation_ahead=True), GPUS["rtx4090"])
    whole, parts = 27 + 2, 27 + 14 * (27 + 27) + 27 + 25
    assert ahead.copy_bytes == (whole * blob.whole_bytes + parts * blob.backward_bytes) // 16
    assert predict(dataclasses.replace(inputs, modulation_ahead=True), GPUS["h100"]).seconds < predict(
        inputs, GPUS["h100"]).seconds
    faster = predict(inputs, GPUS["rtx4090"], path=ComputePath("bfloat16", "fused"))
    assert faster.resident_seconds < fast.resident_seconds
    # fp8 activations: the frozen Linears' forward and recompute at the float8 rate, where there is one.
    assert predict(inputs, GPUS["rtx4090"], path=FP8_PATH).resident_seconds < faster.resident_seconds
    with pytest.raises(ValueError, match="no float8 tensor cores"):
        predict(inputs, GPUS["rtx3090"], path=FP8_PATH)


def test_int8_compute_runs_forward_and_recompute_at_the_int8_rate_and_plans_int8_blocks():
    """int8 compute (timeline.INT8_PATH): the frozen Linears' forward and recompute at the GPU's int8 rate (4x bf16 on
    a 4090, 2x on an H100), their quantisation and int32 output as traffic, the backward as the eager path's; the
    blocks copied as int8 (one byte and a row scale) whatever the storage asked."""
    from trainer_core.planner.timeline import INT8_PATH, RUNTIME, block_work
    from trainer_core.streaming.placement import FORWARD

    inputs = PlanInputs(width=1024, height=1024, rank=32)
    for gpu in ("rtx4090", "h100"):
        assert predict(inputs, GPUS[gpu], path=INT8_PATH).seconds < predict(inputs, GPUS[gpu], path=RUNTIME).seconds
    int8, bf16 = block_work(real_arch(), inputs, INT8_PATH), block_work(real_arch(), inputs, RUNTIME)
    # The frozen Linears' FLOPs move to the int8 tensor cores; attention, the LoRA and the rotation stay in bf16.
    assert int8[FORWARD].int8_ops > 0 == bf16[FORWARD].int8_ops
    assert int8[FORWARD].tensor_flops < bf16[FORWARD].tensor_flops < int8[FORWARD].int8_ops + int8[FORWARD].tensor_flops
    streamed = dataclasses.replace(inputs, blocks_to_swap=20)
    assert predict(streamed, GPUS["rtx4090"], path=INT8_PATH).copy_bytes == predict(
        dataclasses.replace(streamed, storage="int8"), GPUS["rtx4090"], path=INT8_PATH).copy_bytes


@pytest.mark.parametrize("budget, goal", [("16", 0.05), ("8", 0.15)])
def test_plan_gpu_prints_overheads_within_the_goals_on_a_4090(capsys, budget, goal):
    """`plan --gpu rtx4090` at 1024², rank 32: at most 5% at the 16 GiB plan, 15% at 8 GiB, on every compute path.
    Every phase fits at both (at 8 GiB caching streams a few of the text encoder's layers: it alone needs 8.2 GiB)."""
    import re

    from trainer_core.runs.cli import main

    status = main(["plan", "--resolution", "1024", "--rank", "32", "--budget-gb", budget, "--gpu", "rtx4090"])
    assert status == 0
    out = capsys.readouterr().out
    overheads = [float(m) / 100 for m in re.findall(r"^  LoRA in .*?([+-][\d.]+)%$", out, flags=re.M)]
    assert len(overheads) == 5 and all(0 <= o <= goal for o in overheads), out  # 4th, 5th: fp8 activations, int8


def test_the_optimizer_step_moves_the_configured_optimizers_state():
    """The optimizer step's memory traffic: weights and gradients (6 passes of the LoRA dtype), the configured
    optimizer's state read and written, as many bytes as the memory plan counts for it (held to the bytes each
    library allocates in tests/engine/test_optimizers.py), its temporaries written and read, and with EMA the float32
    average read and written and the weights read once more. 8-bit AdamW's step stays at ~28 bytes per value."""
    from trainer_core.core.config import OptimizerConfig, choices
    from trainer_core.planner.optimizer_state import optimizer_state_bytes, optimizer_step_temp_bytes
    from trainer_core.planner.plan import lora_tensor_shapes
    from trainer_core.planner.timeline import optimizer_work

    arch = real_arch()
    shapes = lora_tensor_shapes(arch, "attention+mlp", 32)
    values = sum(r * c for r, c in shapes)
    traffic = {}
    for dtype, value_bytes in (("float32", 4), ("bfloat16", 2)):
        for optimizer in choices(OptimizerConfig, "optimizer"):
            p = PlanInputs(optimizer=optimizer, lora_dtype=dtype)
            traffic[optimizer, dtype] = optimizer_work(arch, p).memory_bytes
            assert traffic[optimizer, dtype] == (6 * value_bytes * values
                                                 + 2 * optimizer_state_bytes(shapes, optimizer, value_bytes)
                                                 + 2 * optimizer_step_temp_bytes(values, optimizer, value_bytes))
            with_ema = optimizer_work(arch, dataclasses.replace(p, ema=True)).memory_bytes
            assert with_ema - traffic[optimizer, dtype] == values * (4 + 4 + value_bytes)
    assert 28 <= traffic["adamw8bit", "float32"] / values < 28.1  # + bitsandbytes' absmax per 256 values
    assert traffic["adamw", "float32"] == (6 * 4 + 2 * 2 * 4 + 2 * 4) * values + 2 * 4 * len(shapes)
    gpu = GPUS["rtx4090"]
    seconds = {o: predict(PlanInputs(optimizer=o), gpu).seconds for o in ("adamw8bit", "adamw", "prodigy")}
    assert seconds["adamw8bit"] < seconds["adamw"] < seconds["prodigy"]  # more state, a longer step
