"""Each member's weights' licence, said where it matters (issue 41): a LoRA trained on Qwen-Image 2.1 derives from
weights under a non-commercial licence, unlike the Apache-2.0 1.x members. The run's status, the LoRA file's metadata
and the README's member table say it."""

from __future__ import annotations

import re

import pytest
from PIL import Image
from safetensors import safe_open

from conftest import REPO, tiny_dataset_config
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.data.cache import build_cache
from trainer_core.data.images import discover
from trainer_core.families import get_family
from trainer_core.families.registry import family_names
from trainer_core.runs.registry import open_run, release

LICENCES = {"qwen-image": "Apache-2.0", "edit": "Apache-2.0", "edit-2509": "Apache-2.0", "edit-2511": "Apache-2.0",
            "qwen-image-layered": "Apache-2.0", "qwen-image-2.1": "Qwen Research License (non-commercial)"}


def test_every_member_names_its_weights_licence_in_the_members_table():
    readme = (REPO / "docs" / "files.md").read_text(encoding="utf-8")  # the table of members and their licences
    assert sorted(family_names()) == sorted(LICENCES)
    for name in family_names():
        family = get_family(name)
        assert family.weights_licence == LICENCES[name]
        rows = [line for line in readme.splitlines()
                if re.match(rf"\| {re.escape(family.display_name)} \(`{re.escape(name)}`", line)]
        assert len(rows) == 1, name
        assert rows[0].rstrip().endswith(f"| {family.weights_licence} |"), rows[0]


@pytest.mark.parametrize("name", ["qwen-image", "qwen-image-2.1"])
def test_the_runs_status_and_its_lora_file_say_the_licence(name, tmp_path):
    components = get_family(name).tiny_components(storage="float32")
    Image.new("RGB", (64, 64), (200, 60, 40)).save(tmp_path / "a.png")
    (tmp_path / "a.txt").write_text("a red square")
    cached = build_cache(components, discover(tiny_dataset_config(tmp_path)), tmp_path / "cache")
    run = open_run(components, cached, LoraConfig(rank=2), OptimizerConfig(optimizer="adamw"),
                   TrainConfig(run_name=f"licence-{name}"), run_dir=None)
    try:
        licence = LICENCES[name]
        assert (f"model: {components.family.display_name}; its weights' licence: {licence} (a LoRA trained on them "
                "derives from them)") in run.status
        run.trainer.train(1)
        path = run.trainer.save_lora(tmp_path / "lora.safetensors")
        with safe_open(str(path), "pt") as f:
            metadata = f.metadata()
        assert metadata["qwen_lora.base_licence"] == metadata["modelspec.license"] == licence
    finally:
        release(f"licence-{name}")
