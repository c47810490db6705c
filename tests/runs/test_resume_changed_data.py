"""A resumed run whose data changed since its checkpoint says so, once, in the status, naming what changed (captions,
pixels and how they are decoded, images added or gone); data as it was says nothing. Real runs of the train command on
the tiny model, the data changed on disk between them."""

from __future__ import annotations

import json
import shutil

from PIL import Image
from test_headless import tiny_run_file

NOTE = "the data differs from the checkpoint of step 3's"


def train(run_file, out, steps, capsys) -> str:
    from trainer_core.runs.cli import main

    assert main(["train", "--config", str(run_file), "--output", str(out), "--steps", str(steps)]) == 0
    return capsys.readouterr().out


def dataset(demo_folder, tmp_path):
    images = tmp_path / "images"
    shutil.copytree(demo_folder, images)
    # One picture with transparency: how it is decoded (its background) is part of what it trains on.
    clear = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    clear.paste((250, 10, 10, 255), (8, 8, 40, 40))
    clear.save(images / "zz_clear.png")
    (images / "zz_clear.txt").write_text("a red square on nothing")
    return images


def test_a_resume_on_changed_data_names_what_changed_once(demo_folder, tmp_path, capsys):
    images = dataset(demo_folder, tmp_path)
    run_file = tiny_run_file(tmp_path, images)
    out = tmp_path / "out"
    train(run_file, out, 2, capsys)
    saved = json.loads(next((out / "t" / "checkpoints").glob("step_*/*.json")).read_text())
    assert len(saved["data"]["samples"]) == len(list(images.glob("*.png")))

    again = train(run_file, out, 3, capsys)  # the same data: nothing said
    assert "resumed run 't' from its checkpoint at step 2" in again and "the data differs" not in again

    captions = sorted(images.glob("0*.txt"))
    captions[0].write_text("re-captioned by hand")
    captions[1].write_text("re-captioned too")
    (images / captions[2].with_suffix(".png").name).unlink()
    captions[2].unlink()
    tables = {"dataset": [{"folder": str(images), "resolution": 64, "min_bucket_side": 32, "max_bucket_side": 128,
                           "background": "#0000ff"}]}
    changed = train(tiny_run_file(tmp_path / "changed", images, **tables), out, 4, capsys)
    assert "resumed run 't' from its checkpoint at step 3" in changed, changed
    assert changed.count(NOTE) == 1, changed
    note = next(line for line in changed.splitlines() if NOTE in line)
    names = sorted(p.with_suffix(".png").name for p in captions[:2])
    assert f"the caption of 2 images changed ({', '.join(names)})" in note, note
    assert "the pixels of 1 image changed (zz_clear.png: the file, or how it is decoded: transparency, background)" \
        in note, note
    assert f"1 image no longer in the dataset ({captions[2].with_suffix('.png').name})" in note, note
    assert "Steps from 4 on train on the data as it is now" in note, note
