"""The catalogue of bad inputs: each gives a UserInputError that names the input and the fix, and
nothing already trained is lost. README.md's troubleshooting section lists the same catalogue."""

import copy
import errno
import json

import pytest
import torch
from PIL import Image

from conftest import cached_demo, pack_module, tiny_dataset_config
from graph_runner import GraphRunner
from test_nodes import tiny_prompt
from trainer_core.data import cache as cache_module
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.data.images import discover
from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image import build_tiny_components, load_diffusers_dir
from trainer_core.models import save_diffusers_dir


def image(folder, name, size=(64, 64), caption="a caption"):
    Image.new("RGB", size, "red").save(folder / f"{name}.png")
    if caption is not None:
        (folder / f"{name}.txt").write_text(caption)


# -- dataset ----------------------------------------------------------------------------------------

def test_missing_dataset_folder(tmp_path):
    with pytest.raises(UserInputError, match=r"dataset folder .*nope.* does not exist\. Point it at a folder"):
        discover(tiny_dataset_config(tmp_path / "nope"))


def test_empty_dataset_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("no images here")
    with pytest.raises(UserInputError, match="has no images .* Add images with same-name .txt captions"):
        discover(tiny_dataset_config(tmp_path))


def test_unreadable_image(tmp_path):
    image(tmp_path, "good")
    (tmp_path / "broken.jpg").write_bytes(b"this is not a jpeg")
    (tmp_path / "broken.txt").write_text("caption")
    with pytest.raises(UserInputError, match=r"image .*broken.jpg cannot be read .* Re-export it or remove it"):
        discover(tiny_dataset_config(tmp_path))


def test_truncated_image(tmp_path):
    image(tmp_path, "cut")
    data = (tmp_path / "cut.png").read_bytes()
    big = Image.effect_noise((64, 64), 50).convert("RGB")
    big.save(tmp_path / "cut.png")
    data = (tmp_path / "cut.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserInputError, match=r"image .*cut.png cannot be read"):
        discover(tiny_dataset_config(tmp_path))


def test_image_smaller_than_its_bucket(tmp_path):
    image(tmp_path, "tiny", size=(40, 40))
    with pytest.raises(UserInputError, match="tiny.png is 40x40, smaller than its 64x64 bucket.*Lower the resolution, "
                                             "enable upscale_small_images, or remove the image"):
        discover(tiny_dataset_config(tmp_path))


def test_missing_caption_is_an_error_or_an_empty_caption(tmp_path):
    image(tmp_path, "alone", caption=None)
    with pytest.raises(UserInputError, match="alone.png has no caption file alone.txt.*set missing_caption to 'empty'"):
        discover(tiny_dataset_config(tmp_path))
    assert discover(tiny_dataset_config(tmp_path, missing_caption="empty"))[0].caption == ""


def test_caption_that_is_not_utf8(tmp_path):
    image(tmp_path, "latin", caption=None)
    (tmp_path / "latin.txt").write_bytes("café au lait".encode("latin-1"))
    with pytest.raises(UserInputError, match=r"caption .*latin.txt is not UTF-8 text .* Re-save it as UTF-8"):
        discover(tiny_dataset_config(tmp_path))


# -- models -----------------------------------------------------------------------------------------

def test_model_folder_that_is_missing(tmp_path):
    with pytest.raises(UserInputError, match="is not a diffusers Qwen-Image folder .*transformer/, vae/"):
        load_diffusers_dir(tmp_path / "nowhere")


def test_model_that_is_not_qwen_image(tmp_path):
    from safetensors.torch import save_file

    save_diffusers_dir(build_tiny_components(), tmp_path / "m")
    transformer = tmp_path / "m" / "transformer"
    (transformer / "diffusion_pytorch_model.safetensors").unlink()
    save_file({"input_blocks.0.0.weight": torch.zeros(4, 4), "conditioner.embedders.0.x": torch.zeros(2)},
              str(transformer / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(UserInputError, match=r"does not match the model: .*missing.*unknown.*"
                                             r"Choose a Qwen-Image transformer file"):
        load_diffusers_dir(tmp_path / "m", storage="float32", compute_dtype=torch.float32)


def test_cache_written_by_another_model_or_version_is_not_used(demo_folder, tmp_path, monkeypatch):
    cached_demo(build_tiny_components(seed=0), demo_folder, tmp_path)
    report = cached_demo(build_tiny_components(seed=9), demo_folder, tmp_path).report
    assert report.latents_reused == 0 and report.prompts_reused == 0
    monkeypatch.setattr(cache_module, "CACHE_VERSION", "older")
    report = cached_demo(build_tiny_components(seed=0), demo_folder, tmp_path).report
    assert report.latents_reused == 0 and report.prompts_reused == 0


# -- settings ---------------------------------------------------------------------------------------

def test_blocks_to_swap_larger_than_the_block_count():
    with pytest.raises(UserInputError, match="blocks_to_swap=60 is too large: the transformer has 2 blocks.*at most 1"):
        TrainConfig(blocks_to_swap=60).check_model(num_blocks=2)


@pytest.mark.parametrize("rank", [0, -4])
def test_rank_zero_or_negative(rank):
    with pytest.raises(UserInputError, match=f"LoRA rank={rank} must be a whole number of at least 1"):
        LoraConfig(rank=rank).validate()


@pytest.mark.parametrize("lr", [0.0, float("nan"), -1e-4])
def test_learning_rate_zero_or_nan(lr):
    with pytest.raises(UserInputError, match="learning_rate=.* must be a positive number"):
        OptimizerConfig(learning_rate=lr).validate()


@pytest.mark.parametrize("name", ["../up", "a/b", "/abs", ""])
def test_run_name_that_is_a_path(name):
    with pytest.raises(UserInputError, match="run_name=.* is not a usable name"):
        TrainConfig(run_name=name).validate()


# -- outputs, through the nodes ---------------------------------------------------------------------

@pytest.fixture
def graph(pack, tmp_path, demo_folder, monkeypatch):
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    return GraphRunner(pack.NODE_CLASS_MAPPINGS), tiny_prompt(tmp_path, demo_folder, steps=2)


OUTSIDE_NAMES = [  # (node, field, value)
    ("10", "filename", "../escape"), ("10", "filename", "/tmp/absolute"), ("10", "filename", "a/../../b"),
    ("3", "cache_folder", "/tmp/elsewhere"), ("3", "cache_folder", "../outside"),
]


def test_output_names_outside_comfyuis_folders_are_refused(pack, graph, tmp_path):
    """Each name in turn, queued to one trainer that has trained two queues (a graph that trains per name cost ~1.5 s
    each): refused, nothing written outside, nothing trained lost."""
    runner, prompt = graph
    runner.run(prompt)
    trainer = runner.run(prompt)["7"][0]
    latest = tmp_path / "output" / "qwen_lora_training" / "runs" / prompt["6"]["inputs"]["run_name"] / "checkpoints"
    for node, field, value in OUTSIDE_NAMES:
        bad = copy.deepcopy(prompt)
        bad[node]["inputs"][field] = value
        with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError,
                           match=f"{field} .* must be a relative name inside"):
            runner.run(bad)
        assert {p.name for p in tmp_path.iterdir()} <= {"output", "loras"}, value  # nothing written beside them
        assert not (tmp_path / "escape.safetensors").exists() and not (tmp_path / "outside").exists()
        assert not any(p.exists() for p in (tmp_path.parent / "escape.safetensors", tmp_path.parent / "b.safetensors"))
        # Nothing trained was lost: every step is still in the trainer and in its newest checkpoint.
        assert json.loads((latest / "latest.json").read_text())["step"] == trainer.step >= 4, value


def test_full_disk_while_saving_the_lora_keeps_the_previous_file(pack, graph, tmp_path, monkeypatch):
    runner, prompt = graph
    prompt["10"]["inputs"]["filename"] = "fixed_name"
    runner.run(prompt)
    saved = tmp_path / "loras" / "fixed_name.safetensors"
    before = saved.read_bytes()
    files = pack_module(pack, "trainer_core.core.files")
    real_save_file = files.save_file

    def disk_full(tensors, filename, metadata=None):
        if "fixed_name" not in str(filename):  # checkpoints go through the same writer: only the LoRA fails
            return real_save_file(tensors, filename, metadata=metadata)
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "save_file", disk_full)
    with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError,
                       match=r"disk is full: the LoRA file could not be written .* Any earlier fixed_name.safetensors "
                             r"is intact and the trainer still holds step 4"):
        runner.run(prompt)
    assert saved.read_bytes() == before
    assert sorted(p.name for p in saved.parent.iterdir()) == ["fixed_name.safetensors"]


def test_resuming_with_a_different_rank(pack, graph):
    runner, prompt = graph
    runner.run(prompt)
    pack_module(pack, "trainer_core.runs.registry").release(prompt["6"]["inputs"]["run_name"])
    prompt["4"]["inputs"]["rank"] = 8
    with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError,
                       match="rank: checkpoint 16, now 8.*new run_name"):
        GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)


def test_a_bad_setting_mid_run_loses_nothing(pack, graph):
    runner, prompt = graph
    trainer = runner.run(prompt)["7"][0]
    prompt["4"]["inputs"]["rank"] = 0
    with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError, match="rank=0"):
        runner.run(prompt)
    prompt["4"]["inputs"]["rank"] = 16
    assert runner.run(prompt)["7"][0] is trainer and trainer.step == 4


def test_catalogue_is_listed_in_the_troubleshooting_page():
    from conftest import REPO

    section = (REPO / "docs" / "troubleshooting.md").read_text()
    for topic in ("dataset folder", "cannot be read", "smaller than its", "no caption", "UTF-8", "not a Qwen-Image",
                  "missing", "another model", "blocks_to_swap", "rank", "learning_rate", "outside", "disk is full",
                  "does not match these settings", "NaN"):
        assert topic in section, topic
