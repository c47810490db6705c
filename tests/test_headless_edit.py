"""Qwen-Image-Edit from a run file: the [edit] table loads the model as the Load Edit node does and reads every
[[dataset]] by the Edit Dataset node's convention (run_files/tiny_edit.toml on the built-in tiny Edit-2511)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from conftest import REPO

EDIT_EXAMPLE = REPO / "run_files" / "tiny_edit.toml"


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
    assert "[edit] needs a Qwen-Image-Edit model" in err and "Traceback" not in err, err
