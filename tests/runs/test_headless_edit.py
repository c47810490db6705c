"""Qwen-Image-Edit from a run file: the [edit] table loads the model as the Load Edit node does and reads every
[[dataset]] by the Edit Dataset node's convention (run_files/tiny_edit.toml on the built-in tiny Edit-2511); with a
Qwen-Image 2.1 model it trains 2.1 reference-image editing (run_files/qwen_image21_edit.toml on the tiny 2.1 export),
the LoRA the canvas's engine calls train, bit for bit."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw
from safetensors.torch import load_file

from conftest import REPO

EDIT_EXAMPLE = REPO / "run_files" / "tiny_edit.toml"


def same_tensors(a: Path, b: Path) -> bool:
    ta, tb = load_file(str(a)), load_file(str(b))
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def test_the_example_edit_dataset_is_what_the_edit_demo_writes(tmp_path):
    """example_dataset/edit_shapes holds what the Edit family's demo dataset writer draws: the same files."""
    from trainer_core.families.qwen_image_edit.demo import make_edit_demo_dataset

    fresh = make_edit_demo_dataset(tmp_path / "edit")
    shipped = REPO / "example_dataset" / "edit_shapes"
    names = sorted(p.name for p in fresh.iterdir())
    assert names == sorted(p.name for p in shipped.iterdir()) and len(names) == 8 * 4
    for name in names:
        if name.endswith(".png"):
            assert np.array_equal(np.asarray(Image.open(fresh / name)), np.asarray(Image.open(shipped / name))), name
        else:
            assert (fresh / name).read_text() == (shipped / name).read_text(), name


def test_the_edit_table_reads_the_variant_and_the_controls_size():
    from trainer_core.runs.run_file import read_run_file

    run, _ = read_run_file(EDIT_EXAMPLE)
    assert run.edit.variant == "edit-2511" and run.edit.data.control_resolution == 96
    without, _ = read_run_file(REPO / "run_files" / "tiny_run.toml")
    assert without.edit is None


def test_the_shipped_edit_run_file_trains_the_tiny_edit_model_on_its_edit_samples(tmp_path, capsys):
    """run_files/tiny_edit.toml as shipped, its dataset cut to its first sample (caching an edit sample is the
    cost: the prompt is encoded with its control images) and 2 steps: the model is the tiny Edit-2511, the folder
    is read as edit samples (two controls, sized by [edit] control_resolution), the step-0 preview edits the
    sample's controls, and the LoRA is written."""
    import shutil

    from trainer_core.runs.cli import main

    folder = tmp_path / "edit_shapes"
    folder.mkdir()
    for path in (REPO / "example_dataset" / "edit_shapes").glob("00_*"):
        shutil.copy(path, folder / path.name)
    run_file = tmp_path / "tiny_edit.toml"
    run_file.write_text(EDIT_EXAMPLE.read_text().replace('"../example_dataset/edit_shapes"', f'"{folder}"'))
    out = tmp_path / "out"
    assert main(["train", "--config", str(run_file), "--output", str(out), "--steps", "2"]) == 0
    printed = capsys.readouterr().out
    assert "model: tiny-qwen-image-edit-2511-seed0" in printed
    assert "1 images x 1 repeats" in printed and "edit samples: 1 with 2 controls; controls sized by 96" in printed
    run = out / "tiny_edit"
    assert Image.open(run / "previews" / "step_000000_0.png").size == (64, 64)
    assert (run / "tiny_edit_000002.safetensors").is_file()


def test_an_edit_run_on_the_shapes_model_is_refused_by_name(tmp_path, capsys):
    import tomllib

    from trainer_core.runs.cli import main

    text = EDIT_EXAMPLE.read_text().replace('source = "tiny"', 'source = "shapes"')
    data = tomllib.loads(text.replace('"../example_dataset/', f'"{REPO / "example_dataset"}/'))
    path = tmp_path / "edit_on_shapes.toml"
    path.write_text(text.replace('"../example_dataset/', f'"{REPO / "example_dataset"}/'))
    assert data["model"]["source"] == "shapes"
    assert main(["train", "--config", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "edit run needs a Qwen-Image-Edit model" in err and "remove [edit]" in err and "Traceback" not in err, err


# Qwen-Image 2.1 editing from a run file: run_files/qwen_image21_edit.toml, its [model] pointed at the tiny 2.1 export
# and its [[dataset]] at a folder with a 288 px reference (example_dataset/edit_shapes' 64 px controls are under the
# 256 px 2.1 refuses; 288 as tests/families/test_qwen_image21_edit.py).
EDIT21_RUN_FILE = REPO / "run_files" / "qwen_image21_edit.toml"
REFERENCE_SIDE = 288


@pytest.fixture(scope="module")
def files21(tmp_path_factory):
    from trainer_core.families import get_family

    return get_family("qwen-image-2.1").export_tiny(tmp_path_factory.mktemp("tiny21"), layout="comfyui")


def edit21_folder(folder: Path) -> Path:
    """One edit: a not-square target, its instruction, and one reference beside it."""
    folder.mkdir(parents=True)
    Image.new("RGB", (128, 64), (200, 60, 40)).save(folder / "a.png")
    (folder / "a.txt").write_text("paint the circle red")
    reference = Image.new("RGB", (REFERENCE_SIDE, REFERENCE_SIDE), "white")
    ImageDraw.Draw(reference).ellipse((60, 60, 220, 220), fill=(40, 70, 220))
    reference.save(folder / "a_control.png")
    return folder


def edit21_run_file(tmp_path: Path, files21, **edit) -> Path:
    """The shipped 2.1 edit run file, its paths on the tiny files and a 288 px edit folder, CPU-sized."""
    from trainer_core.runs.run_file_toml import render

    data = tomllib.loads(EDIT21_RUN_FILE.read_text())
    assert data["edit"]["variant"] == "auto" and data["model"]["source"] == "files"
    data["model"].update(transformer=str(files21["transformer_bf16"]),
                         diffusers_folder=str(files21["diffusers_folder"]), compute_dtype="float32")
    data["edit"].update(control_resolution=REFERENCE_SIDE, **edit)
    data["dataset"][0].update(folder=str(edit21_folder(tmp_path / "edits")), resolution=64, min_bucket_side=32,
                              max_bucket_side=128)
    data["train"].update(blocks_to_swap=0, gradient_checkpointing=False, checkpoint_every=0)
    data["previews"].update(preview_every=0, preview_size=64)
    path = tmp_path / "run.toml"
    path.write_text(render(data))
    return path


def test_a_21_edit_run_file_trains_the_lora_the_canvas_trains_bit_for_bit(files21, tmp_path, capsys):
    """A headless 2.1 edit run of 2 steps writes the LoRA, bit for bit, that the canvas's engine calls give with the
    same settings: Load Edit's 2.1 load (`families.loading.load_model_set`), the Edit Dataset's folder reading, the Cache node's
    build (which finds every entry the run cached: the same entries) and the Trainer."""
    from trainer_core.core.config import DatasetConfig
    from trainer_core.data.cache import build_cache
    from trainer_core.data.edit_dataset import load_edit_dataset
    from trainer_core.families.loading import LoadRequest, load_model_set
    from trainer_core.runs.cli import main
    from trainer_core.runs.run_file import read_run_file
    from trainer_core.training import Trainer

    path = edit21_run_file(tmp_path, files21)
    out = tmp_path / "out"
    assert main(["train", "--config", str(path), "--output", str(out), "--steps", "2"]) == 0
    printed = capsys.readouterr().out
    assert "model: qwen_image21_tiny" in printed
    assert f"edit samples: 1 with 1 control; controls sized by {REFERENCE_SIDE}" in printed, printed
    headless_lora = out / "qwen_image21_edit_lora" / "qwen_image21_edit_lora_000002.safetensors"
    assert headless_lora.is_file()

    run, _ = read_run_file(path)
    components = load_model_set(LoadRequest(run.load.source, torch.device("cpu"), storage=run.load.storage,
                                 compute_dtype=run.load.compute_dtype, transformer=run.load.transformer,
                                 text_encoder=None, diffusers_folder=run.load.diffusers_folder))
    assert components.family.name == "qwen-image-2.1"
    cfg = run.datasets[0]
    dataset = load_edit_dataset(DatasetConfig(**{f: getattr(cfg, f) for f in ("folder", "resolution", "min_bucket_side",
                                                                              "max_bucket_side")}), run.edit.data)
    cached = build_cache(components, list(dataset.samples), out / "cache", preview_prompts=run.preview_prompts,
                         settings=components.family.data_settings(dataset))
    assert cached.report.latents_encoded == 0 and cached.report.prompts_encoded == 0, cached.report.summary()
    (sample,) = cached.samples
    assert sample.condition_sizes == ((REFERENCE_SIDE, REFERENCE_SIDE),)
    trainer = Trainer(components, cached, run.lora, run.optimizer, run.train)
    try:
        trainer.train(2)
        canvas_lora = tmp_path / "canvas.safetensors"
        trainer.save_lora(canvas_lora, getattr(torch, run.save.dtype), layout=run.save.layout)
    finally:
        trainer.close()
    trained = load_file(str(headless_lora))
    assert any(k.endswith("lora_B.weight") and t.abs().sum() > 0 for k, t in trained.items())  # it has trained
    assert same_tensors(headless_lora, canvas_lora)


def test_a_21_edit_run_with_an_edit_variant_is_refused_naming_the_field(files21, tmp_path, capsys):
    from trainer_core.runs.cli import main

    path = edit21_run_file(tmp_path, files21, variant="edit-2511")
    assert main(["train", "--config", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "edit_variant is 'edit-2511', but the model is Qwen-Image 2.1" in err and '[edit] variant = "auto"' in err, err
    assert "Traceback" not in err
