"""Prior preservation, two ways: datasets with loss weights (a regularisation set among them), and differential
output preservation (the LoRA's prediction for the class caption pulled towards the base model's)."""

import shutil

import pytest
import torch

from conftest import adapter_snapshot, tiny_dataset_config
from trainer_core.core.config import CacheConfig, LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.data.cache import build_cache
from trainer_core.data.images import load_dataset
from trainer_core.data.mixture import combined
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.training import Trainer
from trainer_core.training.step import FlowMatchingStep
from trainer_core.training.weighting import DatasetLosses

# The demo captions are "a red circle on a white background", ...: "red" is the trigger of two of the eight.
TRIGGER, CLASS = ("red", "colourful")


@pytest.fixture(scope="module")
def reg_folder(demo_folder, tmp_path_factory):
    """Four of the demo images as a second dataset (a 'regularisation set'), same size: mixed micro-batches."""
    folder = tmp_path_factory.mktemp("reg")
    for path in sorted(demo_folder.iterdir())[:8]:  # 4 images and their captions
        shutil.copy(path, folder / path.name)
    return folder


def _cache(components, folders_weights, cache_dir, preservation=None, **dataset):
    datasets = [load_dataset(tiny_dataset_config(folder, loss_weight=w, is_regularization=reg, **dataset))
                for folder, w, reg in folders_weights]
    samples, validation, repeats = combined(datasets)
    return build_cache(components, samples, cache_dir, repeats=repeats, validation=validation,
                       preservation=preservation)


def _trainer(cached, components, **train):
    settings = dict(seed=1, blocks_to_swap=0, gradient_checkpointing=False)
    settings.update(train)
    return Trainer(components, cached, LoraConfig(rank=4, alpha=4.0, targets="all"),
                   OptimizerConfig(optimizer="adamw", learning_rate=5e-3), TrainConfig(**settings))


# -- datasets with weights -----------------------------------------------------------------------------------

def test_a_steps_loss_is_the_weighted_mean_of_the_datasets_losses(demo_folder, reg_folder, tiny_cache):
    components = build_tiny_components(seed=0, storage="float32")
    # One bucket (square crops): every micro-batch holds 2 samples.
    cached = _cache(components, [(demo_folder, 1.0, False), (reg_folder, 0.25, True)], tiny_cache,
                    enable_buckets=False)
    assert {s.dataset for s in cached.samples} == {demo_folder.name, reg_folder.name}
    trainer = _trainer(cached, components, micro_batch_size=2, grad_accum_steps=2)
    for number in range(6):  # a micro-batch: (1/B) sum_d w_d n_d L_d
        tally, batch = DatasetLosses(), trainer.built.flow.draw(number)
        loss = trainer.built.flow.loss(batch, tally).item()
        parts = tally.report()
        assert loss == pytest.approx(sum(d.weight * d.samples * d.mean for d in parts.values()) / 2, rel=1e-6, abs=0)
    reports = []
    trainer.train(2, on_step=reports.append)
    mixed = 0
    for report in reports:
        parts = report.datasets
        samples = sum(d.samples for d in parts.values())
        assert samples == 4  # 2 micro-batches of 2: equal sizes, so the step's mean is over its samples
        expected = sum(d.weight * d.samples * d.mean for d in parts.values()) / samples
        assert report.loss == pytest.approx(expected, rel=1e-6, abs=0)
        assert parts[reg_folder.name].regularization if reg_folder.name in parts else True
        mixed += len(parts) == 2
    assert mixed  # some step had samples of both datasets
    assert [step for step, _ in trainer.progress.dataset_loss_history] == [1, 2]


def test_weights_of_one_give_the_unweighted_loss_bit_for_bit(demo_folder, reg_folder, tiny_cache):
    components = build_tiny_components(seed=0, storage="float32")
    cached = _cache(components, [(demo_folder, 1.0, False), (reg_folder, 1.0, True)], tiny_cache)
    trainer = _trainer(cached, components, micro_batch_size=2)
    flow = trainer.built.flow
    for number in range(3):
        batch = flow.draw(number)
        embeds = [cached.embedding(s.text_key) for s in batch.samples]
        plain = flow.flow_loss(batch.x0, batch.noise, batch.levels, embeds)  # the loss as it was before weights
        tally = DatasetLosses()
        assert torch.equal(flow.loss(batch, tally), plain)
        assert torch.equal(flow.loss(batch), plain)
        # A weight of 2 on every sample doubles the loss (up to the order of the sums).
        doubled = [s.__class__(**{**s.__dict__, "loss_weight": 2.0}) for s in batch.samples]
        assert flow.loss(batch.__class__(**{**batch.__dict__, "samples": doubled})).item() == pytest.approx(
            2 * plain.item(), rel=1e-6)


def test_dataset_labels_are_distinct_and_weights_checked(demo_folder):
    same_twice = [load_dataset(tiny_dataset_config(demo_folder, enable_buckets=b)) for b in (True, False)]
    samples, _, _ = combined(same_twice)
    assert {s.dataset for s in samples} == {f"{demo_folder.name}@64", f"{demo_folder.name}@64 (2)"}
    with pytest.raises(UserInputError, match="loss_weight"):
        tiny_dataset_config(demo_folder, loss_weight=-1.0)


# -- differential output preservation ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dop_cache(tiny_cache):
    """The shared cache folder of the seed-0 tiny model (entries are content-addressed)."""
    return tiny_cache


def _dop_trainer(demo_folder, cache_dir, weight=0.7, preservation=(TRIGGER, CLASS), **train):
    components = build_tiny_components(seed=0, storage="float32")
    cached = _cache(components, [(demo_folder, 1.0, False)], cache_dir, preservation=preservation)
    return _trainer(cached, components, preservation_weight=weight, **train)


def _batch_with_trigger(flow, size=None):
    for number in range(64):
        batch = flow.draw(number)
        if any(s.preservation_text_key for s in batch.samples):
            return batch
    raise AssertionError("no micro-batch with the trigger")


def test_class_captions_are_cached_and_a_cached_run_needs_no_encoder(demo_folder, dop_cache):
    from test_cache import _count_encoder_calls

    _cache(build_tiny_components(seed=0, storage="float32"), [(demo_folder, 1.0, False)], dop_cache,
           preservation=(TRIGGER, CLASS))
    components = build_tiny_components(seed=0, storage="float32")  # a fresh model set: everything from disk
    vae_calls, text_calls = _count_encoder_calls(components)
    cached = _cache(components, [(demo_folder, 1.0, False)], dop_cache, preservation=(TRIGGER, CLASS))
    assert (vae_calls.calls, text_calls.calls) == (0, 0)
    assert cached.report.prompts_encoded == 0
    with_trigger = [s for s in cached.samples if s.preservation_text_key]
    assert sorted(s.caption for s in with_trigger) == ["a red circle on a white background",
                                                       "a red square on a white background"]
    # The class caption's entry is the class caption encoded as any prompt is.
    fresh = build_tiny_components(seed=0, storage="float32")
    key = fresh.family.cache_conditioning(fresh, [], None).text_key("a colourful circle on a white background", None)
    assert key in {s.preservation_text_key for s in with_trigger}


def test_preservation_settings_are_checked(demo_folder, tiny_cache):
    with pytest.raises(UserInputError, match="preservation_class is empty"):
        CacheConfig(preservation_trigger="sks person")
    with pytest.raises(UserInputError, match="preservation_trigger is empty"):
        CacheConfig(preservation_class="person")
    with pytest.raises(UserInputError, match="both 'person'"):
        CacheConfig(preservation_trigger="person", preservation_class="person")
    components = build_tiny_components(seed=0, storage="float32")
    with pytest.raises(UserInputError, match=f"appears in no caption .*{demo_folder.name}"):
        _cache(components, [(demo_folder, 1.0, False)], tiny_cache, preservation=("sks", "shape"))
    cached = _cache(components, [(demo_folder, 1.0, False)], tiny_cache)
    with pytest.raises(UserInputError, match="no class captions"):
        _trainer(cached, components, preservation_weight=1.0)


def test_the_base_prediction_is_the_model_without_its_adapter_exactly(demo_folder, dop_cache):
    from trainer_core.training.preservation import base_prediction

    trainer = _dop_trainer(demo_folder, dop_cache)
    trainer.train(2)  # the adapter is no longer a no-op
    flow, batch = trainer.built.flow, _batch_with_trigger(trainer.built.flow)
    rows = [i for i, s in enumerate(batch.samples) if s.preservation_text_key]
    embeds = [trainer.dataset.embedding(batch.samples[i].preservation_text_key) for i in rows]
    inputs = (batch.x0[rows], batch.noise[rows], batch.levels[rows], embeds)
    grads = [p.requires_grad for p in trainer.built.params]
    base = base_prediction(trainer.built.transformer, flow.predict, *inputs)
    # the off-switch left them as they were
    assert [p.requires_grad for p in trainer.built.params] == grads and all(grads)
    assert not base.requires_grad
    # The oracle: the same weights in a model that never had an adapter, a separate forward.
    bare = build_tiny_components(seed=0, storage="float32")
    bare_flow = FlowMatchingStep(bare.transformer, trainer.dataset, trainer.built.order, trainer.train_cfg,
                                 bare.scheduler_config, bare.device, bare.compute_dtype, bare.family)
    with torch.no_grad():
        assert torch.equal(base, bare_flow.predict(*inputs))
        assert not torch.equal(base, flow.predict(*inputs))  # with the adapter on it differs


def test_the_preservation_term_is_the_weighted_mse_to_the_base_prediction(demo_folder, dop_cache):
    weight = 0.7
    trainer = _dop_trainer(demo_folder, dop_cache, weight=weight, micro_batch_size=2)
    trainer.train(2)
    flow, batch = trainer.built.flow, _batch_with_trigger(trainer.built.flow)
    rows = [i for i, s in enumerate(batch.samples) if s.preservation_text_key]
    embeds = [trainer.dataset.embedding(s.text_key) for s in batch.samples]
    class_embeds = [trainer.dataset.embedding(batch.samples[i].preservation_text_key) for i in rows]
    bare = build_tiny_components(seed=0, storage="float32")
    bare_flow = FlowMatchingStep(bare.transformer, trainer.dataset, trainer.built.order, trainer.train_cfg,
                                 bare.scheduler_config, bare.device, bare.compute_dtype, bare.family)
    with torch.no_grad():
        inputs = (batch.x0[rows], batch.noise[rows], batch.levels[rows], class_embeds)
        adapted, base = flow.predict(*inputs), bare_flow.predict(*inputs)  # separate forwards
        flow_part = flow.flow_loss(batch.x0, batch.noise, batch.levels, embeds)
        expected = flow_part + weight * ((adapted - base) ** 2).mean() * len(rows) / len(batch.samples)
        total = flow.loss(batch)
    assert float(expected) > float(flow_part)
    # The step batches the class rows with the training rows: equal up to the batch's rounding.
    assert float(total) == pytest.approx(float(expected), rel=1e-5)


def test_weight_zero_is_no_preservation_bit_for_bit(demo_folder, dop_cache, tmp_path):
    off = _dop_trainer(demo_folder, dop_cache, weight=0.0, preservation=None, micro_batch_size=2)
    zero = _dop_trainer(demo_folder, dop_cache, weight=0.0, micro_batch_size=2)
    on = _dop_trainer(demo_folder, dop_cache, weight=1.0, micro_batch_size=2)
    for trainer in (off, zero, on):
        trainer.train(2)
    a, b, c = adapter_snapshot(off), adapter_snapshot(zero), adapter_snapshot(on)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert off.progress.loss_history == zero.progress.loss_history
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_chunks_and_resume_with_preservation_and_streamed_blocks_are_bit_exact(demo_folder, dop_cache, tmp_path):
    """With a swapped block, checkpointing and modulation ahead (the plan holds the class rows' timesteps)."""
    settings = dict(micro_batch_size=2, grad_accum_steps=2, blocks_to_swap=1, gradient_checkpointing=True)
    whole = _dop_trainer(demo_folder, dop_cache, **settings)
    whole.train(4)
    assert whole.built.runner.swapper is not None and whole.built.runner.forwards_from_plan > 0
    components = build_tiny_components(seed=0, storage="float32")
    cached = _cache(components, [(demo_folder, 1.0, False)], dop_cache, preservation=(TRIGGER, CLASS))
    settings.update(seed=1, preservation_weight=0.7)
    lora, optim = LoraConfig(rank=4, alpha=4.0, targets="all"), OptimizerConfig(optimizer="adamw", learning_rate=5e-3)
    first = Trainer(components, cached, lora, optim, TrainConfig(**settings), run_dir=tmp_path / "run")
    first.train(1)
    first.train(1)  # two chunks
    first.close()
    components = build_tiny_components(seed=0, storage="float32")
    cached = _cache(components, [(demo_folder, 1.0, False)], dop_cache, preservation=(TRIGGER, CLASS))
    resumed = Trainer(components, cached, lora, optim, TrainConfig(**settings), run_dir=tmp_path / "run")
    assert resumed.resume() and resumed.step == 2
    resumed.train(2)
    a, b = adapter_snapshot(whole), adapter_snapshot(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert whole.progress.loss_history == resumed.progress.loss_history


# -- the memory plan and the timeline model -----------------------------------------------------------------

def test_the_timeline_has_preservations_forwards_as_a_real_step_runs_them():
    """A base forward (adapter off, no gradient) and a training forward of twice the rows, as the step runs them
    through the block runner with streamed blocks: the schedule predicts the same events, byte for byte."""
    from test_timeline import TINY

    from trainer_core.adapters.lora import adapter_disabled, inject_lora
    from trainer_core.devtools.random_weights import random_transformer
    from trainer_core.planner import arch_from_transformer
    from trainer_core.planner.plan import block_blob
    from trainer_core.planner.timeline import BASE_FORWARD, schedule
    from trainer_core.streaming.placement import BACKWARD, FORWARD, spread_placement
    from trainer_core.streaming.runner import BlockRunner
    from trainer_core.training.preservation import preservation_loss

    model = random_transformer(TINY, storage="float8", compute_dtype=torch.float32)
    inject_lora(model, LoraConfig(rank=4, alpha=4.0, targets="all"), seed=0)
    placement = spread_placement(6, 5, ring=2)
    runner = BlockRunner(model, torch.device("cpu"), checkpointing=True, placement=placement)
    events = runner.record()
    g = torch.Generator().manual_seed(0)
    grid, shapes = 4, [[(1, 4, 4)]]
    for _ in range(3):
        x = torch.randn(1, grid * grid, 64, generator=g)  # (B, tokens, 64)
        prompt, class_prompt = torch.randn(2, 1, 8, 32, generator=g)  # (B, text tokens, joint dim) each
        t = torch.tensor([0.5])
        with torch.no_grad(), adapter_disabled(model):
            base = model(hidden_states=x, encoder_hidden_states=class_prompt, timestep=t, img_shapes=shapes,
                         return_dict=False)[0]
        both = model(hidden_states=torch.cat([x, x]), encoder_hidden_states=torch.cat([prompt, class_prompt]),
                     timestep=torch.cat([t, t]), img_shapes=shapes * 2, return_dict=False)[0]
        target = torch.randn(1, grid * grid, 64, generator=g)
        (torch.nn.functional.mse_loss(both[:1], target) + preservation_loss(both[1:], base, 1, 1.0)).backward()
    runner.uninstall()
    blob = block_blob(arch_from_transformer(model), "float8")
    predicted = schedule(6, placement, [BASE_FORWARD, FORWARD, BACKWARD] * 3, blob)
    # The runner records every ascending pass as a forward; the model names the base forward apart (its work).
    assert events == [("compute", e[1], FORWARD) if e[0] == "compute" and e[2] == BASE_FORWARD else e
                      for e in predicted]
    assert sum(e[0] == "copy" for e in events) > sum(e[0] == "copy" for e in schedule(
        6, placement, [FORWARD, BACKWARD] * 3, blob))


def test_the_plan_counts_preservations_rows_and_its_extra_forward():
    from trainer_core.planner import PlanInputs
    from trainer_core.planner.arch import real_arch
    from trainer_core.planner.plan import plan_memory
    from trainer_core.planner.timeline import BASE_FORWARD, FORWARD, GPUS, block_work, predict

    lora, optim = LoraConfig(rank=32), OptimizerConfig()
    plain = PlanInputs.from_configs(lora, optim, TrainConfig(micro_batch_size=2, blocks_to_swap=20), 1024, 1024)
    dop = PlanInputs.from_configs(lora, optim, TrainConfig(micro_batch_size=2, blocks_to_swap=20,
                                                           preservation_weight=1.0), 1024, 1024)
    assert (plain.batch, plain.preservation, dop.batch, dop.preservation) == (2, False, 4, True)
    arch = real_arch()
    assert plan_memory(dop, arch).gpu_total > plan_memory(plain, arch).gpu_total
    # The base forward: the plain run's forward at the micro-batch's rows, without the LoRA.
    base, plain_forward = block_work(arch, dop)[BASE_FORWARD], block_work(arch, plain)[FORWARD]
    assert base.tensor_flops + base.fp32_flops < plain_forward.tensor_flops + plain_forward.fp32_flops
    gpu = GPUS["rtx4090"]
    assert predict(dop, gpu).seconds > predict(plain, gpu).seconds
    assert predict(dop, gpu).copy_bytes > predict(plain, gpu).copy_bytes  # the base forward streams the blocks too


# -- the run file -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_shipped_preservation_run_file_trains(tmp_path, capsys):
    """run_files/tiny_preservation.toml as shipped, 2 of its steps: its [cache] preservation keys reach the cache
    (a weight without class captions would be refused) and the run trains."""
    from conftest import REPO
    from trainer_core.runs.cli import main
    from trainer_core.runs.run_file import read_run_file

    path = REPO / "run_files" / "tiny_preservation.toml"
    run, _ = read_run_file(path)
    assert (run.cache.preservation_trigger, run.cache.preservation_class) == ("red circle", "circle")
    assert run.train.preservation_weight == 1.0
    assert main(["train", "--config", str(path), "--output", str(tmp_path), "--steps", "2"]) == 0
    assert "lora: " in capsys.readouterr().out


def test_the_reports_show_each_datasets_mean_loss(pack):
    """Train Steps' report and the loss plot: each dataset's mean over the steps of the chunk (shown)."""
    from conftest import pack_module
    from trainer_core.training.plot import dataset_means, loss_plot
    from trainer_core.training.reports import TrainReport
    from trainer_core.training.weighting import DatasetLoss, describe

    history = [(2, {"a": 9.0}), (3, {"a": 1.0, "reg": 2.0}), (4, {"a": 3.0})]
    assert dataset_means(history, first_step=3) == {"a": 2.0, "reg": 2.0}
    report = TrainReport(first_step=3, last_step=4, losses=[0.5, 0.7])
    text = pack_module(pack, "nodes.train_nodes").report_text(report, 0.7, (), history)
    assert "per dataset: a 2.0000, reg 2.0000" in text.splitlines()[0]
    assert "per dataset" not in pack_module(pack, "nodes.train_nodes").report_text(report, 0.7)
    assert loss_plot([(2, 1.0), (3, 0.5), (4, 0.7)], datasets=history).size == (768, 384)
    assert describe({"a": DatasetLoss(0.1, 3, 1.0, False), "reg": DatasetLoss(0.2, 1, 0.5, True)}) == (
        "a 0.1000, reg (regularisation, x0.5) 0.2000")
