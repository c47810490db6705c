"""Messages that point to the right fix: an Edit-2511 sample with four controls is told of the member that takes more
(Qwen-Image 2.1), not of 2511 itself; `transparency = "keep"` on an RGB model refuses a picture that really is
transparent and trains an RGBA file that is opaque everywhere (it is the same picture flattened)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PIL import Image

from conftest import tiny_dataset_config
from trainer_core.core.config import DatasetConfig, EditDataConfig
from trainer_core.core.errors import UserInputError
from trainer_core.data.cache import build_cache
from trainer_core.data.images import discover


def edit_sample(folder: Path, controls: int) -> None:
    folder.mkdir(parents=True)
    Image.new("RGB", (64, 64), (200, 60, 40)).save(folder / "a.png")
    (folder / "a.txt").write_text("make it blue")
    for i in range(1, controls + 1):
        Image.new("RGB", (64, 64), (10 * i, 90, 200)).save(folder / ("a_control.png" if i == 1 else f"a_control_{i}.png"))


@pytest.mark.parametrize("variant, controls, advice", [
    ("edit-2511", 4, r"train Qwen-Image 2\.1, which edits with up to 10 reference images"),
    ("edit-2509", 4, r"train Qwen-Image 2\.1, which edits with up to 10 reference images"),
    ("edit", 2, r"train Edit-2509 or Edit-2511 \(up to 3\)"),
])
def test_too_many_controls_point_to_the_member_that_takes_more(tmp_path, variant, controls, advice):
    from trainer_core.data.edit_dataset import discover_edit
    from trainer_core.families.qwen_image_edit.tiny import build_tiny_edit_components

    edit_sample(tmp_path / "d", controls)
    samples = list(discover_edit(DatasetConfig(folder=str(tmp_path / "d"), resolution=64, min_bucket_side=32,
                                               max_bucket_side=128)))
    with pytest.raises(UserInputError) as refused:
        build_cache(build_tiny_edit_components(variant), samples, tmp_path / "cache",
                    settings=EditDataConfig(control_resolution=128))
    message = str(refused.value)
    assert f"a.png has {controls} control images, but {variant} takes" in message
    assert re.search(advice, message), message
    if variant != "edit":  # never "train Edit-2509 / Edit-2511" to a 2511 run that takes no more than 3 either
        assert "train Edit-" not in message, message


def test_keep_transparency_on_an_rgb_model_refuses_only_really_transparent_pictures(tiny, tmp_path):
    """An RGBA file whose every pixel is opaque trains (as its RGB, the cache key flatten's); one with a single pixel
    at alpha 254 is transparent and refused by name."""
    opaque = Image.new("RGBA", (64, 64), (30, 140, 220, 255))
    opaque.putpixel((3, 3), (250, 250, 10, 255))
    opaque.save(tmp_path / "opaque_rgba.png")
    (tmp_path / "opaque_rgba.txt").write_text("a blue square")
    kept = build_cache(tiny, discover(tiny_dataset_config(tmp_path, transparency="keep")), tmp_path / "cache")
    flat = build_cache(tiny, discover(tiny_dataset_config(tmp_path, transparency="flatten")), tmp_path / "cache")
    assert len(kept.samples) == 1 and kept.samples[0].latent_key == flat.samples[0].latent_key

    barely = opaque.copy()
    barely.putpixel((10, 10), (30, 140, 220, 254))
    barely.save(tmp_path / "barely.png")
    (tmp_path / "barely.txt").write_text("a blue square")
    with pytest.raises(UserInputError, match=r"image barely.png is transparent and its dataset's transparency is "
                                             r"'keep', but Qwen-Image's VAE encodes RGB only"):
        build_cache(tiny, discover(tiny_dataset_config(tmp_path, transparency="keep")), tmp_path / "cache2")
