"""Modulation ahead: with streamed blocks, the first training forward of a window computes the streamed blocks'
modulation outputs for the whole window (their weights are on the GPU then), and the window's other forwards
copy those blocks without the modulation weights (streaming.runner.BlockRunner.plan_modulation, streaming.placement).

Checked here: the modulation inputs computed apart are the forward's own, bit for bit (Qwen-Image and
Edit-2511's zero_cond_t); a planned run computes exactly what an unplanned one does while copying fewer bytes,
with the copies, waits and computes the timeline model schedules, Edit-2511's doubled rows included; a plan that
is not the forward's fails loudly; and the trainer's results do not change with it, previews in between
included."""


import pytest
import torch

from conftest import cached_demo
from test_timeline import TINY
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.devtools.random_weights import random_transformer
from trainer_core.training.live import PreviewSettings
from trainer_core.training import StepExtras
from trainer_core.adapters.lora import inject_lora
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.models.modulation import modulation_inputs, supports_modulation_ahead
from trainer_core.training.objective import flow_loss
from trainer_core.streaming.runner import BlockRunner
from trainer_core.planner import arch_from_transformer
from trainer_core.planner.plan import block_blob
from trainer_core.planner.timeline import schedule
from trainer_core.streaming.placement import BACKWARD, FORWARD, spread_placement
from trainer_core.training import Trainer

GRID, TEXT = 4, 8  # image tokens per side, prompt tokens


def lora_model(config: dict | None = None) -> torch.nn.Module:
    model = random_transformer(dict(TINY, **(config or {})), storage="float8", compute_dtype=torch.float32)
    inject_lora(model, LoraConfig(rank=4, alpha=4.0, targets="attention+mlp"), seed=0)
    return model


def batches(steps: int, batch: int = 1) -> list[tuple[torch.Tensor, ...]]:
    """(latent tokens (B, N, 64), prompt (B, L, 32), timestep (B,), target (B, N, 64)) per step, from one seed."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, GRID * GRID, 64, generator=g), torch.randn(batch, TEXT, 32, generator=g),
             torch.rand(batch, generator=g), torch.randn(batch, GRID * GRID, 64, generator=g)) for _ in range(steps)]


def step(model, x, prompt, t, target) -> float:
    prediction = model(hidden_states=x, encoder_hidden_states=prompt, timestep=t,
                       img_shapes=[[(1, GRID, GRID)]] * x.shape[0], return_dict=False)[0]
    loss = flow_loss(prediction, target)
    loss.backward()
    return loss.item()


@pytest.mark.parametrize("zero_cond_t", [False, True])
def test_the_modulation_inputs_computed_apart_are_the_forwards_own(zero_cond_t):
    model = random_transformer(dict(TINY, zero_cond_t=zero_cond_t), storage="float8", compute_dtype=torch.bfloat16)
    seen = {}
    for name in ("img_mod", "txt_mod"):
        getattr(model.transformer_blocks[3], name)[1].register_forward_pre_hook(
            lambda m, args, name=name: seen.__setitem__(f"{name}.1", args[0]))
    t = torch.tensor([0.25, 0.8], dtype=torch.bfloat16)  # (B,)
    controls = 1 if zero_cond_t else 0  # Edit-2511: a control image's tokens after the target's
    x = torch.randn(2, GRID * GRID * (1 + controls), 64, dtype=torch.bfloat16)
    with torch.no_grad():
        model(hidden_states=x, encoder_hidden_states=torch.randn(2, TEXT, 32, dtype=torch.bfloat16), timestep=t,
              img_shapes=[[(1, GRID, GRID)] * (1 + controls)] * 2, return_dict=False)
    computed = modulation_inputs(model, t, torch.bfloat16)
    assert computed.keys() == seen.keys()
    assert all(torch.equal(computed[k], seen[k]) for k in seen)
    assert computed["img_mod.1"].shape[0] == (4 if zero_cond_t else 2)


def test_a_planned_run_computes_the_same_copies_less_and_follows_the_schedule():
    placement, window, steps = spread_placement(6, 5, ring=2), 3, 6  # two windows of 3 forwards
    data = batches(steps)
    results = {}
    for planned in (False, True):
        model = lora_model()
        runner = BlockRunner(model, torch.device("cpu"), checkpointing=True, placement=placement)
        events = runner.record()
        losses, grads = [], []
        for n, (x, prompt, t, target) in enumerate(data):
            if planned and n % window == 0:
                assert runner.plan_modulation([b[2] for b in data[n:n + window]])
            losses.append(step(model, x, prompt, t, target))
            grads.append([p.grad.clone() for p in model.parameters() if p.requires_grad])
            model.zero_grad(set_to_none=True)
        results[planned] = losses, grads, runner.swapper.bytes_copied, list(events)
        runner.uninstall()
    (losses, grads, plain_bytes, _), (ahead_losses, ahead_grads, ahead_bytes, events) = results[False], results[True]
    assert losses == ahead_losses
    assert all(torch.equal(a, b) for g, h in zip(grads, ahead_grads) for a, b in zip(g, h))
    blob = block_blob(arch_from_transformer(model), "float8")
    # Per full window (2 of them), the 2 later forwards copy the 3 blocks not in the ring without their
    # modulation Linears, and the 2 backwards before them reload the ring's first 2 blocks without them too.
    assert plain_bytes - ahead_bytes == 2 * (2 * 3 + 2 * 2) * blob.tail_bytes > 0
    # The timeline model's schedule, event for event, byte for byte.
    assert events == schedule(6, placement, [FORWARD, BACKWARD] * steps, blob, modulation_window=window)


def test_a_plan_that_is_not_the_forwards_fails_loudly():
    model = lora_model()
    runner = BlockRunner(model, torch.device("cpu"), checkpointing=True, placement=spread_placement(6, 5, ring=2))
    (x, prompt, t, target), = batches(1)
    assert runner.plan_modulation([t + 0.5, t])  # the window's first forward is not at t + 0.5
    with pytest.raises(RuntimeError, match="another input than planned"):
        step(model, x, prompt, t, target)
    assert runner.plan_modulation([t, t + 0.5])  # the second forward is not
    step(model, x, prompt, t, target)
    with pytest.raises(RuntimeError, match="another input than planned"):
        step(model, x, prompt, t, target)
    runner.uninstall()


def test_it_stays_off_where_the_modulation_input_needs_a_gradient_or_nothing_is_streamed():
    model = lora_model()
    assert supports_modulation_ahead(model)
    assert not BlockRunner(model, torch.device("cpu"), checkpointing=True).plan_modulation([torch.rand(1)])
    model.time_text_embed.timestep_embedder.linear_1.weight.requires_grad_(True)  # as a LoRA there would
    assert not supports_modulation_ahead(model)
    runner = BlockRunner(model, torch.device("cpu"), checkpointing=True, placement=spread_placement(6, 5, ring=2))
    assert not runner.plan_modulation([torch.rand(1)])
    runner.uninstall()


def test_the_trainers_results_are_bit_identical_with_it_and_it_copies_less(tmp_path, demo_folder):
    """bf16 compute, float8 blocks, a streamed block, 2 micro-batches per step, previews between the steps
    (their forwards need the modulation weights, in the middle of a window): 6 steps with modulation ahead
    equal 6 steps without, bit for bit, in 2 + 4 steps too. (The tiny model has 2 blocks: its one streamed
    block never leaves its slot, so no bytes are saved here; the runner's tests above count them.)"""
    components = build_tiny_components(seed=0, storage="float8", compute_dtype=torch.bfloat16)
    cached = cached_demo(components, demo_folder, tmp_path / "cache")
    extras = StepExtras(preview_every=2, preview=PreviewSettings("a red square on a white background", size=64, steps=2))
    runs = {}
    for window, chunks in ((0, (6,)), (4, (6,)), (4, (2, 4))):
        trainer = Trainer(components, cached, LoraConfig(rank=4, alpha=4.0), OptimizerConfig(optimizer="adamw"),
                          TrainConfig(seed=1, blocks_to_swap=1, grad_accum_steps=2))
        trainer.modulation_window = window
        losses = [loss for n in chunks for loss in trainer.train(n, work=extras.work()).losses]
        runs[window, chunks] = (losses, [p.detach().clone() for p in trainer.built.params],
                                trainer.built.runner.forwards_from_plan, [p.image for p in trainer.step_previews])
        trainer.close()
    plain = runs[0, (6,)]
    for key in ((4, (6,)), (4, (2, 4))):
        losses, params, from_plan, previews = runs[key]
        assert losses == plain[0]
        assert all(torch.equal(a, b) for a, b in zip(params, plain[1]))
        assert [p.tobytes() for p in previews] == [p.tobytes() for p in plain[3]]
        # Windows of 4 forwards (2 steps): 3 of each 4 forwards read their modulation outputs from the plan.
        assert from_plan == 9 and plain[2] == 0


def test_edit_2511s_doubled_modulation_rows_are_planned_too():
    """Edit-2511's zero_cond_t modulates the control tokens at timestep 0: img_mod takes twice the rows. A planned
    run of such a model (a control image's tokens after the target's) computes what an unplanned one does."""
    data = batches(3, batch=2)
    results = {}
    for planned in (False, True):
        model = lora_model(dict(zero_cond_t=True))
        runner = BlockRunner(model, torch.device("cpu"), checkpointing=True, placement=spread_placement(6, 5, ring=2))
        if planned:
            assert runner.plan_modulation([b[2] for b in data])
        losses, g = [], torch.Generator().manual_seed(1)
        for x, prompt, t, target in data:
            with_control = torch.cat([x, torch.randn(x.shape, generator=g)], dim=1)  # (B, 2N, 64): target, control
            prediction = model(hidden_states=with_control, encoder_hidden_states=prompt, timestep=t,
                               img_shapes=[[(1, GRID, GRID), (1, GRID, GRID)]] * 2, return_dict=False)[0]
            loss = flow_loss(prediction[:, : GRID * GRID], target)
            loss.backward()
            losses.append(loss.item())
        results[planned] = losses, [p.grad.clone() for p in model.parameters() if p.requires_grad], \
            runner.forwards_from_plan
        runner.uninstall()
    assert results[True][0] == results[False][0] and results[True][2] == 2
    assert all(torch.equal(a, b) for a, b in zip(results[True][1], results[False][1]))
