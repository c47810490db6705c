"""The Dataset node's folder: relative paths are inside ComfyUI's input folder (not the working directory),
the input folder's subfolders are offered as choices, and errors name the absolute folder looked in."""

import shutil

import pytest

import host_standin
from conftest import pack_module

SETTINGS = dict(resolution=64, enable_buckets=True, min_bucket_side=32, max_bucket_side=128, repeats=1,
                caption_extension=".txt", missing_caption="error", upscale_small_images=False, background="white",
                allow_large_images=False)


@pytest.fixture
def comfy_dirs(tmp_path, monkeypatch, demo_folder):
    """A ComfyUI folder layout behind the stand-in folder_paths, with the demo dataset in input/shapes, and
    the working directory somewhere else (as when ComfyUI is started from its parent folder)."""
    host_standin.install_folder_paths(monkeypatch, tmp_path / "ComfyUI")
    shutil.copytree(demo_folder, tmp_path / "ComfyUI" / "input" / "shapes")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return tmp_path / "ComfyUI" / "input"


def test_a_relative_folder_is_inside_the_input_folder(pack, comfy_dirs):
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRADataset"]()
    dataset, summary = node.discover(folder="shapes", **SETTINGS)
    assert dataset.samples and all(s.image_path.startswith(str(comfy_dirs / "shapes")) for s in dataset.samples)
    assert dataset.config.folder == str(comfy_dirs / "shapes")
    # The example workflows' old default ('input/<name>', meant from ComfyUI's folder) still finds it.
    old, _ = node.discover(folder="input/shapes", **SETTINGS)
    assert old.samples == dataset.samples


def test_the_input_folder_subfolders_are_choices(pack, comfy_dirs):
    (comfy_dirs / ".hidden").mkdir()
    (comfy_dirs / "a_file.png").write_bytes(b"")
    cls = pack.NODE_CLASS_MAPPINGS["QwenLoRADataset"]
    choices, options = cls.INPUT_TYPES()["optional"]["input_folder"]
    assert choices == ["(custom path)", "shapes"] and options["default"] == "(custom path)"
    chosen, _ = cls().discover(folder="ignored when a subfolder is chosen", input_folder="shapes", **SETTINGS)
    typed, _ = cls().discover(folder=str(comfy_dirs / "shapes"), **SETTINGS)  # an absolute path as typed
    assert chosen.samples == typed.samples
    assert cls.IS_CHANGED(folder="", input_folder="shapes") == cls.IS_CHANGED(folder="shapes")


def test_errors_name_the_absolute_folder_looked_in(pack, comfy_dirs):
    errors = pack_module(pack, "trainer_core.core.errors")
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRADataset"]()
    with pytest.raises(errors.UserInputError, match="dataset folder '" + str(comfy_dirs / "nope") + "' does not exist"):
        node.discover(folder="nope", **SETTINGS)
    with pytest.raises(errors.UserInputError, match="no dataset folder chosen: .*" + str(comfy_dirs)):
        node.discover(folder="  ", **SETTINGS)


def test_standalone_a_relative_folder_is_inside_QWEN_LORA_INPUT(pack, tmp_path, monkeypatch, demo_folder):
    shutil.copytree(demo_folder, tmp_path / "in" / "shapes")
    monkeypatch.setenv("QWEN_LORA_INPUT", str(tmp_path / "in"))
    monkeypatch.chdir(tmp_path)
    dataset, _ = pack.NODE_CLASS_MAPPINGS["QwenLoRADataset"]().discover(folder="shapes", **SETTINGS)
    assert dataset.config.folder == str(tmp_path / "in" / "shapes")
