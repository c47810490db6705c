"""Images to Dataset: an IMAGE batch from the graph trains like a folder, cached by its pixels."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import api_workflow
from graph_runner import GraphRunner
from test_nodes import loras_dir, tiny_prompt  # noqa: F401 (loras_dir: a fixture)


class GraphBatch:
    """A graph node that outputs the IMAGE batch (and MASK batch) a test sets, as an upstream ComfyUI node would."""

    FUNCTION = "give"
    images = None
    mask = None

    def give(self):
        return (GraphBatch.images, GraphBatch.mask)


def picture_batch(count=3, size=96, seed=0) -> torch.Tensor:
    """(count, size, size, 3) float in [0, 1]: a coloured square on white, each in another colour and place."""
    rng = np.random.default_rng(seed)
    batch = np.ones((count, size, size, 3), dtype=np.float32)
    for i in range(count):
        x, y = rng.integers(0, size // 2, 2)
        batch[i, y:y + size // 3, x:x + size // 3] = rng.random(3)
    return torch.from_numpy(batch)


@pytest.fixture
def graph_prompt(tmp_path, demo_folder, loras_dir):
    """The tiny API workflow with its Dataset node replaced by Images to Dataset fed by `GraphBatch`."""
    prompt = tiny_prompt(tmp_path, demo_folder, steps=2)
    prompt["30"] = {"class_type": "GraphBatch", "inputs": {}}
    prompt["2"] = {"class_type": "QwenLoRAImagesToDataset", "inputs": {
        "images": ["30", 0], "captions": "a red square\na green square\na blue square", "resolution": 64,
        "enable_buckets": True, "min_bucket_side": 32, "max_bucket_side": 128, "repeats": 1,
        "upscale_small_images": False, "background": "white", "transparency": "auto", "validation_images": 0,
        "mask_background_weight": 0.1, "loss_weight": 1.0, "is_regularization": False}}
    return prompt


def run_graph(pack, prompt, images, mask=None):
    GraphBatch.images, GraphBatch.mask = images, mask
    runner = GraphRunner({**pack.NODE_CLASS_MAPPINGS, "GraphBatch": GraphBatch})
    return runner.run(prompt)


def test_a_graph_batch_trains_and_an_unchanged_one_is_not_encoded_again(pack, graph_prompt):
    images = picture_batch()
    first = run_graph(pack, graph_prompt, images)
    assert first["7"][0].step == 2
    assert first["2"][1].startswith("3 images x 1 repeats; buckets 64x64: 3")
    assert first["3"][1].startswith("latents: 3 encoded, 0 from cache")
    captions = sorted(s.caption for s in first["7"][0].dataset.samples)
    assert captions == ["a blue square", "a green square", "a red square"]
    # A fresh graph (ComfyUI restarted: nothing cached) with the same pixels: the same files, nothing encoded.
    graph_prompt["6"]["inputs"]["run_name"] += "_again"
    again = run_graph(pack, graph_prompt, images.clone())
    assert again["3"][1].startswith("latents: 0 encoded, 3 from cache")
    # One picture changed by one step of 8 bits: that one is encoded again, the other two come from the cache.
    changed = images.clone()
    changed[1, 0, 0, 0] = 254 / 255
    graph_prompt["6"]["inputs"]["run_name"] += "_changed"
    third = run_graph(pack, graph_prompt, changed)
    assert third["3"][1].startswith("latents: 1 encoded, 2 from cache")


def test_its_pictures_are_the_folder_a_dataset_node_would_read(pack, graph_prompt, tmp_path):
    """The same pixels as PNG files with their captions in a folder: the Dataset node finds the same samples (cache
    keys included)."""
    images = picture_batch(count=2)
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRAImagesToDataset"]()
    settings = {k: v for k, v in graph_prompt["2"]["inputs"].items() if k not in ("images", "captions")}
    dataset, _ = node.build(images, "a square", **settings)
    folder = tmp_path / "by_hand"
    folder.mkdir()
    for i, picture in enumerate(images):
        Image.fromarray((picture.numpy() * 255).round().astype(np.uint8)).save(folder / f"p{i}.png")
        (folder / f"p{i}.txt").write_text("a square")
    by_hand, _ = pack.NODE_CLASS_MAPPINGS["QwenLoRADataset"]().discover(
        str(folder), **{k: v for k, v in settings.items() if k != "validation_images"})
    assert [(s.image_sha256, s.bucket, s.caption) for s in dataset.samples] == \
        [(s.image_sha256, s.bucket, s.caption) for s in by_hand.samples]
    assert {s.dataset for s in dataset.samples} == {"graph images"}


def test_a_mask_batch_is_each_pictures_loss_mask(pack, graph_prompt):
    images = picture_batch(count=2)
    mask = torch.zeros((1, 96, 96))
    mask[:, 16:80, 16:80] = 1.0  # one mask for both pictures: the middle trains
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRAImagesToDataset"]()
    settings = {k: v for k, v in graph_prompt["2"]["inputs"].items() if k not in ("images", "captions")}
    dataset, summary = node.build(images, "a square", mask=mask, **settings)
    assert "2 with a loss mask (black weighs 0.1)" in summary
    masks = [np.asarray(Image.open(s.mask.path)) for s in dataset.samples]
    assert all(m.shape == (96, 96) and m[48, 48] == 255 and m[0, 0] == 0 for m in masks)


@pytest.mark.parametrize("captions, mask, says", [
    ("", None, "captions is empty"),
    ("one\ntwo", None, "captions has 2 lines for 3 images"),
    ("a square", torch.zeros((1, 64, 64)), "mask is 0 everywhere"),
    ("a square", torch.ones((1, 50, 50)), "mask is 50x50 pixels but the images are 96x96"),
    ("a square", torch.ones((2, 96, 96)), "mask holds 2 masks for 3 images"),
])
def test_bad_captions_or_masks_are_named(pack, graph_prompt, captions, mask, says):
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRAImagesToDataset"]()
    settings = {k: v for k, v in graph_prompt["2"]["inputs"].items() if k not in ("images", "captions")}
    with pytest.raises(Exception, match=says) as raised:
        node.build(picture_batch(), captions, mask=mask, **settings)
    assert type(raised.value).__name__ == "UserInputError"  # the pack's own (loaded as ComfyUI loads it)


def test_the_graph_images_workflow_loads_crops_and_trains(pack, tmp_path, loras_dir, monkeypatch):
    """The shipped workflow as a user queues it (cut to 4 of its steps): Load Image (ComfyUI's input/example.png, here
    a stand-in picture of its 768x768 size), Image Crop, Images to Dataset, and the shapes model trains on the crop."""
    monkeypatch.setenv("QWEN_LORA_MODELS", str(tmp_path / "no_models"))
    inputs = tmp_path / "input"
    inputs.mkdir()
    Image.fromarray((picture_batch(count=1, size=768)[0].numpy() * 255).astype(np.uint8)).save(inputs / "example.png")
    monkeypatch.setenv("QWEN_LORA_INPUT", str(inputs))
    prompt = json.loads(api_workflow("graph_images").read_text())
    assert [prompt[i]["class_type"] for i in ("24", "25", "2")] == ["LoadImage", "ImageCrop", "QwenLoRAImagesToDataset"]
    assert prompt["2"]["inputs"]["images"] == ["25", 0] and prompt["25"]["inputs"]["image"] == ["24", 0]
    prompt["6"]["inputs"]["run_name"] = f"graph_{tmp_path.name}"[:60]
    prompt["7"]["inputs"].update(steps=4, preview_every=0)
    prompt["8"]["inputs"]["steps"] = 2
    outputs = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)
    crop = prompt["25"]["inputs"]
    assert outputs["25"][0].shape == (1, crop["height"], crop["width"], 3)
    trainer = outputs["7"][0]
    assert trainer.step == 4 and [s.caption for s in trainer.dataset.samples] == [prompt["2"]["inputs"]["captions"]]
