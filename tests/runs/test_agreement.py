"""What the processes of one run compare before any step (runs/agreement.py), in one process: every setting of the
run file but the per-machine ones is compared, and a machine whose images differ is named with the image. The
compare over real processes (two torchrun node groups whose run files disagree) is test_distributed.py's launch C."""

from __future__ import annotations

import shutil

from PIL import Image

from conftest import cached_demo
from test_headless import tiny_run_file
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.runs.agreement import PER_MACHINE, Place, run_settings, setting_differences, start_differences, \
    start_report
from trainer_core.runs.run_file import KEYS, read_run_file
from trainer_core.training import Trainer


def test_every_run_file_setting_but_where_files_are_and_how_a_gpu_holds_the_model_is_compared(tmp_path, demo_folder):
    run, _ = read_run_file(tiny_run_file(tmp_path, demo_folder, edit={"variant": "auto"}))
    settings = run_settings(run, steps=9)
    compared = {name.split("] ")[-1].split(" ")[-1] for name in settings}
    assert {k.name for k in KEYS if (k.table, k.name) not in PER_MACHINE} <= compared
    assert {"transformer", "folder", "cache_folder", "continue_from_lora", "blocks_to_swap"}.isdisjoint(compared)
    assert settings["--steps"] == 9 and settings["[edit] variant"] == "auto"
    other, _ = read_run_file(tiny_run_file(tmp_path / "b", demo_folder, edit={"variant": "auto"},
                                           train={"seed": 2, "blocks_to_swap": 1}))
    places = [Place(0, "a", 0, "a.toml"), Place(1, "b", 1, "b.toml")]
    assert setting_differences(list(zip(places, (settings, run_settings(other))))) == [
        "[train] seed is 1 on machine 0 (process 0 on a, a.toml) and 2 on machine 1 (process 1 on b, b.toml)",
        "--steps is 9 on machine 0 (process 0 on a, a.toml) and not set on machine 1 (process 1 on b, b.toml)"]


def test_a_machine_whose_image_differs_is_named_with_the_image(tmp_path, demo_folder, tiny_cache):
    """The same run settings and model, a dataset folder of the same names: image 3's pixels differ on machine 1."""
    other = tmp_path / "node1_images"
    shutil.copytree(demo_folder, other)
    third = sorted(p for p in other.iterdir() if p.suffix == ".png")[2]
    Image.open(third).transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(third)
    reports = []
    for node, folder in enumerate((demo_folder, other)):
        components = build_tiny_components(seed=0, storage="float32")
        trainer = Trainer(components, cached_demo(components, folder, tiny_cache), LoraConfig(rank=4),
                          OptimizerConfig(optimizer="adamw"), TrainConfig(run_name=f"n{node}", blocks_to_swap=0))
        reports.append((Place(node, "h", node, f"run{node}.toml"), start_report(trainer)))
        trainer.close()
    assert start_differences(reports[:1] * 2) == []
    (difference,) = start_differences(reports)
    assert difference == (f"training image 3: {demo_folder / third.name} and {third} on machine 0 (process 0 on h, "
                          "run0.toml) and on machine 1 (process 1 on h, run1.toml) differ in content (the image, its "
                          "caption, mask or weight, or the text encoder or VAE file that cached it)")
