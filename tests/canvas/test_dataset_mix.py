"""The Dataset Mix node: several datasets in one canvas run, cached and trained as a run file's [[dataset]] tables
are (data/mixture.py)."""

import shutil

import pytest

from graph_runner import GraphRunner
from test_nodes import tiny_prompt
from trainer_core.core.errors import UserInputError
from trainer_core.data.mixture import combined, mix


@pytest.fixture(scope="module")
def reg_folder(demo_folder, tmp_path_factory):
    """Four of the demo images as a second dataset (a 'regularisation set')."""
    folder = tmp_path_factory.mktemp("mix_reg")
    for path in sorted(demo_folder.iterdir())[:8]:  # 4 images and their captions
        shutil.copy(path, folder / path.name)
    return folder


def mixed_prompt(tmp_path, demo_folder, reg_folder, steps=2, from_files=False):
    """The example workflow with a second Dataset node (the regularisation set: weight 0.5, 2 repeats) and a Dataset
    Mix of both feeding the Cache node."""
    prompt = tiny_prompt(tmp_path, demo_folder, steps=steps, from_files=from_files)
    prompt["6"]["inputs"].update(micro_batch_size=2, blocks_to_swap=0)
    prompt["20"] = {"class_type": "QwenLoRADataset", "inputs": {
        **prompt["2"]["inputs"], "folder": str(reg_folder), "repeats": 2, "loss_weight": 0.5, "is_regularization": True}}
    prompt["21"] = {"class_type": "QwenLoRADatasetMix", "inputs": {"dataset_1": ["2", 0], "dataset_2": ["20", 0]}}
    prompt["3"]["inputs"]["dataset"] = ["21", 0]
    return prompt


def test_a_mix_in_the_canvas_caches_and_trains_what_a_run_files_datasets_do(pack, tmp_path, demo_folder, reg_folder,
                                                                             monkeypatch):
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    outputs = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(mixed_prompt(tmp_path, demo_folder, reg_folder))
    subject, reg = outputs["2"][0], outputs["20"][0]
    trainer = outputs["7"][0]
    try:
        # The cache holds what the run file's path (headless.cache_once: `combined`) gives for the two datasets:
        # the subject's 8 images, then the set's 4, labelled, weighted, with repeats per sample.
        samples, validation, repeats = combined([subject, reg])
        cached = trainer.dataset
        assert [(s.image_path, s.caption, s.dataset, s.loss_weight, s.regularization) for s in cached.samples] == [
            (s.image_path, s.caption, s.dataset, s.loss_weight, s.regularization) for s in samples]
        assert [s.dataset for s in cached.samples] == [demo_folder.name] * 8 + [reg_folder.name] * 4
        assert {(s.loss_weight, s.regularization) for s in cached.samples[8:]} == {(0.5, True)}
        assert cached.repeats == repeats == (1,) * 8 + (2,) * 4
        assert trainer.step == 2
        # The loss report has each dataset's mean (the Train Steps report says so per dataset).
        assert "per dataset" in outputs["7"][2].splitlines()[0]
        assert [step for step, _ in trainer.progress.dataset_loss_history] == [1, 2]
        summary = outputs["21"][1]
        assert summary.splitlines()[0] == "2 datasets, 12 images in all:"
        assert f"- {reg_folder.name} (regularisation, loss weight 0.5): 4 images x 2 repeats" in summary
    finally:
        trainer.close()


def test_a_mix_flattens_mixes_and_labels_a_folder_used_twice_apart(demo_folder, reg_folder):
    from trainer_core.data.images import load_dataset
    from conftest import tiny_dataset_config

    a = load_dataset(tiny_dataset_config(demo_folder))
    b = load_dataset(tiny_dataset_config(reg_folder, loss_weight=0.5))
    nested = mix([mix([a, b]), a])  # a mix wired into a mix: its datasets, in order
    assert nested.parts == (a, b, a)
    labels = [s.dataset for s in combined(list(nested.parts))[0]]
    name = f"{demo_folder.name}@64"  # one folder twice: its resolution, then a count, tell them apart
    assert labels == [name] * 8 + [reg_folder.name] * 4 + [f"{name} (2)"] * 8
    with pytest.raises(UserInputError, match="at least two datasets"):
        mix([a])


def test_a_mix_of_edit_datasets_takes_one_control_size(pack, tmp_path):
    from conftest import pack_module
    from test_edit_pipelines import control_images
    from test_edit_training import write_sample

    # The engine as the pack imported it (the nodes' datasets are its classes).
    mixture = pack_module(pack, "trainer_core.data.mixture")
    family = pack_module(pack, "trainer_core.families").get_family("edit-2511")
    errors = pack_module(pack, "trainer_core.core.errors")

    write_sample(tmp_path / "one", "a", "make it blue", control_images()[:1])
    write_sample(tmp_path / "two", "b", "make it green", control_images()[:1])
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRAEditDataset"]()
    settings = dict(resolution=64, enable_buckets=True, min_bucket_side=32, max_bucket_side=128, repeats=1,
                    caption_extension=".txt", missing_caption="error", upscale_small_images=False, background="white",
                    allow_large_images=False)
    one = node.discover(folder=str(tmp_path / "one"), control_resolution=96, **settings)[0]
    two = node.discover(folder=str(tmp_path / "two"), control_resolution=128, **settings)[0]
    same = node.discover(folder=str(tmp_path / "two"), control_resolution=96, **settings)[0]
    assert mixture.data_settings(family, mixture.mix([one, same])).control_resolution == 96
    with pytest.raises(errors.UserInputError, match="different edit-2511 data settings"):
        mixture.data_settings(family, mixture.mix([one, two]))
    # A text-to-image dataset in an edit mix is named as what it is, not as a settings mismatch.
    write_sample(tmp_path / "plain", "c", "a photo", [])
    plain = pack.NODE_CLASS_MAPPINGS["QwenLoRADataset"]().discover(folder=str(tmp_path / "plain"), **settings)[0]
    with pytest.raises(errors.UserInputError, match="has no control images"):
        mixture.data_settings(family, mixture.mix([one, plain]))


def test_a_new_loss_weight_in_the_mix_rebuilds_the_live_trainer_from_its_checkpoint(pack, tmp_path, demo_folder,
                                                                                     reg_folder, monkeypatch):
    """A queue after a dataset's loss_weight or is_regularization changed trains with the new ones: the live trainer
    is not continued on the old cache's weights (its signature holds them), it is rebuilt and resumes at its step."""
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    prompt = mixed_prompt(tmp_path, demo_folder, reg_folder, steps=1)
    first = runner.run(prompt)["7"][0]
    again = runner.run(prompt)["7"][0]
    assert again is first and again.step == 2  # the same inputs continue the live trainer
    for change in ({"loss_weight": 0.25}, {"is_regularization": False}):
        prompt["20"]["inputs"].update(change)
        outputs = runner.run(prompt)
        trainer = outputs["7"][0]
        assert trainer is not first and trainer.step == first.step + 1
        assert "resumed run" in outputs["6"][1]
        reg = [s for s in trainer.dataset.samples if s.dataset == reg_folder.name]
        assert {(s.loss_weight, s.regularization) for s in reg} == {(0.25, change.get("is_regularization", True))}
        first = trainer
    first.close()
