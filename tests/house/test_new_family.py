"""A new Qwen-Image member is one package (issue 40): tests/house/toy_family/ defines a family entirely in the test tree (its
package, its hooks, its dataset convention, its tiny model, its demo), registered by name. It caches, trains (its run
planned by the memory plan, its blocks streamed), previews and saves end to end, and the command line plans and
demonstrates it by its name, with no file of the pack knowing it."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from safetensors.torch import load_file

from trainer_core.core.config import DatasetConfig, LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.data.cache import build_cache
from trainer_core.families import family_names, get_family, register_family, unregister_family
from trainer_core.planner import inputs_for_run
from trainer_core.planner.arch import arch_for_components
from trainer_core.planner.inference import parts_for_components
from trainer_core.planner.phases import plan_phases
from trainer_core.runs.registry import open_run, release


@pytest.fixture
def toy():
    register_family("toy_family", ["toy-captions"])
    try:
        yield get_family("toy-captions")
    finally:
        unregister_family("toy_family")
    assert "toy-captions" not in family_names()


def test_a_family_of_the_test_tree_caches_trains_previews_and_saves(toy, tmp_path):
    from toy_family.family import PREVIEW_PROMPT

    components = toy.tiny_components(storage="float8")
    assert components.family is toy and components.num_blocks == 3
    samples, settings = toy.demo().make_dataset(tmp_path / "data")
    assert [s.caption for s in samples] == ["a red toy block", "a green toy block", "a blue toy block",
                                            "a yellow toy block"]  # its own convention: captions.json
    cached = build_cache(components, samples, tmp_path / "cache", preview_prompts=[PREVIEW_PROMPT], settings=settings)
    assert cached.family == "toy-captions" and cached.report.prompts_encoded == 6  # 4 captions, "", its preview
    settings = LoraConfig(rank=4, targets="all"), OptimizerConfig(learning_rate=1e-3), TrainConfig(run_name="toy", seed=0)
    # Its run as the memory plan sees it on a GPU: its 3 blocks (its transformer's architecture), its largest bucket.
    inputs = dataclasses.replace(inputs_for_run(components, cached, *settings, blocks_to_swap=1), device="cuda")
    plan = plan_phases(inputs, arch_for_components(components), parts=parts_for_components(components))
    resident = next(t for t in plan.phases["train"].gpu if t.name == "frozen block Linears, resident")
    assert (inputs.width, inputs.height) == (64, 64) and resident.note.startswith("2 of 3 blocks")
    run = open_run(components, cached, *settings[:2], dataclasses.replace(settings[2], blocks_to_swap=1),
                   run_dir=tmp_path / "run")
    trainer = run.trainer
    try:
        assert trainer.decided.swap.blocks_to_swap == 1
        report = trainer.train(3)
        assert trainer.step == 3 and all(math.isfinite(loss) for loss in report.losses)
        image = trainer.sample_preview(PREVIEW_PROMPT, "", width=64, height=64, steps=2, cfg_scale=4.0, seed=0)
        assert image.size == (64, 64)
        lora = load_file(str(trainer.save_lora(tmp_path / "toy.safetensors")))
    finally:
        release("toy")
    blocks = {int(k.split(".")[2]) for k in lora}
    assert blocks == {0, 1, 2} and all(k.startswith("diffusion_model.transformer_blocks.") for k in lora)
    assert all(torch.isfinite(t).all() for t in lora.values())


def test_the_command_line_plans_and_demonstrates_it_by_its_name(toy, tmp_path, capsys):
    from trainer_core.runs.cli import main

    assert main(["plan", "--model", "toy-captions", "--budget-gb", "24", "--ram-gb", "64"]) == 0
    assert "3 of 3 blocks" in capsys.readouterr().out  # its own transformer (planned_arch), resident in 24 GiB
    assert main(["demo", "--model", "toy-captions", "--steps", "2", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "tiny-toy-seed0 (toy-captions)" in out and (tmp_path / "demo" / "toy_lora.safetensors").is_file()


def test_its_dataset_is_refused_by_the_families_that_do_not_train_on_it_and_the_other_way(toy, tmp_path,
                                                                                             demo_folder):
    from toy_family.family import write_demo_folder

    from trainer_core.data.images import discover

    table = toy.load_dataset(DatasetConfig(folder=str(write_demo_folder(tmp_path / "t")), resolution=64)).samples
    with pytest.raises(UserInputError, match=r"this dataset is a caption-table dataset: load a model that trains on "
                                             r"caption-table datasets \(Toy \(captions from a table\)\)"):
        get_family("qwen-image").check_samples(list(table))
    with pytest.raises(UserInputError, match=r"the loaded model is Toy .*an images dataset.*\(.*Qwen-Image 2\.1.*\)"):
        toy.check_samples(discover(DatasetConfig(folder=str(demo_folder), resolution=64)))
