"""The two Preview nodes: text-to-image Preview shows no control image sockets, Preview (Edit) takes them; each
refuses the other kind of trainer by naming the node to use. The Edit workflow, as shipped, runs through its Edit
Preview, whose images are the shared sampler's (`Trainer.sample_preview`) bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import api_workflow, pack_module, ui_workflow
from graph_runner import GraphRunner, RecordImages
from trainer_core.families.qwen_image_edit.demo import CONTROL_RESOLUTION, make_edit_demo_dataset

EDIT_WORKFLOW = api_workflow("edit")
SETTINGS = dict(prompt="", width=64, height=64, steps=2, cfg=4.0, preview_seed=3)


def as_image(picture: Image.Image) -> torch.Tensor:
    """PIL -> ComfyUI IMAGE (1, H, W, 3) float32 in [0, 1], as a Load Image gives it."""
    return torch.from_numpy(np.asarray(picture.convert("RGB"), dtype=np.float32) / 255.0).unsqueeze(0)


def test_text_to_image_preview_has_no_control_sockets_and_the_edit_preview_has_ten(pack):
    """Ten control sockets: Qwen-Image 2.1 edits with up to ten references (Edit-2509/2511 take three, Edit one)."""
    preview = pack.NODE_CLASS_MAPPINGS["QwenLoRAPreview"].INPUT_TYPES()
    edit = pack.NODE_CLASS_MAPPINGS["QwenLoRAEditPreview"].INPUT_TYPES()
    assert set(preview) == {"required"} and not [n for n, s in preview["required"].items() if s[0] == "IMAGE"]
    assert edit["required"] == preview["required"]  # the same trainer socket and widgets
    assert {n: s[0] for n, s in edit["optional"].items()} == {f"control_image_{i}": "IMAGE" for i in range(1, 11)}
    assert pack.NODE_DISPLAY_NAME_MAPPINGS["QwenLoRAEditPreview"] == "Qwen LoRA Preview (Edit)"
    for stem, node_type in (("main", "QwenLoRAPreview"), ("first_run", "QwenLoRAPreview"),
                            ("edit", "QwenLoRAEditPreview")):
        (node,) = [n for n in json.loads(ui_workflow(stem).read_text())["nodes"] if n["id"] == 8]
        assert node["type"] == node_type, stem
        assert [i["name"] for i in node["inputs"]] == ["trainer", *([f"control_image_{i}" for i in range(1, 11)]
                                                                    if node_type == "QwenLoRAEditPreview" else [])]


@pytest.fixture(scope="module")
def edit_run(pack, tmp_path_factory):
    """The Edit workflow as shipped, on the built-in tiny Edit-2511 and one sample of its demo dataset (one tiny
    control), 2 steps: (its outputs by node id, the images the core image nodes received, another sample's control
    to wire in)."""
    tmp = tmp_path_factory.mktemp("edit_run")
    folder = make_edit_demo_dataset(tmp / "edit_dataset", controls=1)
    other_control = Image.open(folder / "01_red_square_control.png").convert("RGB")  # a picture to wire in
    for path in folder.iterdir():  # one sample is enough (caching is the fixture's cost)
        if not path.name.startswith("00_"):
            path.unlink()
    prompt = json.loads(EDIT_WORKFLOW.read_text())
    prompt["1"]["inputs"].update(source="tiny test model (random weights)", compute_dtype="float32",
                                 storage="float32")
    prompt["2"]["inputs"].update(folder=str(folder), resolution=64, min_bucket_side=32, max_bucket_side=128,
                                 control_resolution=CONTROL_RESOLUTION)
    prompt["3"]["inputs"].update(preview_prompts="paint the circle red", cache_folder="edit_preview_cache")
    prompt["6"]["inputs"].update(run_name="edit_preview", blocks_to_swap=0, gradient_checkpointing=False,
                                 checkpoint_every=0)
    prompt["7"]["inputs"].update(steps=2, preview_every=0, snapshot_every=0)
    prompt["8"]["inputs"].update(SETTINGS)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("QWEN_LORA_LORAS", str(tmp / "loras"))
        env.setenv("QWEN_LORA_OUTPUT", str(tmp / "output"))
        RecordImages.received.clear()
        outputs = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)
        received = list(RecordImages.received)
    yield outputs, received, other_control
    outputs["7"][0].close()


def shared_sampler(trainer, settings: dict, control_images=None) -> torch.Tensor:
    """The image `Trainer.sample_preview` gives for the node's `settings` (its empty prompt: the cached preview
    prompt; the cached negative prompt)."""
    image = trainer.sample_preview("paint the circle red", trainer.dataset.negative_prompt, settings["width"],
                                   settings["height"], settings["steps"], settings["cfg"], settings["preview_seed"],
                                   control_images=control_images)
    return as_image(image)


def test_the_edit_workflow_previews_through_edit_preview_as_the_shared_sampler_does(pack, edit_run):
    outputs, received, _ = edit_run
    trainer = outputs["7"][0]
    assert trainer.step == 2
    preview = received[0]  # Save Image's: the Edit Preview's image (its controls unwired: the first sample's)
    assert torch.equal(preview, outputs["8"][0]) and preview.shape == (1, 64, 64, 3)
    assert torch.equal(preview, shared_sampler(trainer, SETTINGS))


def test_edit_preview_edits_the_wired_control_images_as_the_shared_sampler_does(pack, edit_run):
    outputs, _, control = edit_run
    trainer = outputs["7"][0]
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRAEditPreview"]()
    with torch.inference_mode():  # as ComfyUI runs a node
        (wired, _mask) = node.preview(trainer, **SETTINGS, control_image_1=as_image(control))
    assert torch.equal(wired, shared_sampler(trainer, SETTINGS, [control]))
    assert not torch.equal(wired, outputs["8"][0])  # another picture than the first sample's control


def test_edit_preview_takes_the_tenth_socket_and_refuses_more_images_than_the_variant_takes(pack, edit_run):
    """The sockets go to ten (Qwen-Image 2.1's references); an Edit-2511 trainer takes three, said by name."""
    errors = pack_module(pack, "trainer_core.core.errors")
    outputs, _, control = edit_run
    trainer = outputs["7"][0]
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRAEditPreview"]()
    with torch.inference_mode():
        (tenth, _mask) = node.preview(trainer, **SETTINGS, control_image_10=as_image(control))
    assert torch.equal(tenth, shared_sampler(trainer, SETTINGS, [control]))  # a lone socket is Picture 1
    four = {f"control_image_{i}": as_image(control) for i in (1, 2, 3, 4)}
    with pytest.raises(errors.UserInputError, match="4 control images were given, but edit-2511 takes at most 3"):
        node.preview(trainer, **SETTINGS, **four)


def test_text_to_image_preview_refuses_an_edit_trainer_naming_the_edit_preview(pack, edit_run):
    """What an older Edit workflow meets: the canvas drops the control_image links it no longer declares, and
    an API-format prompt still holds them (ComfyUI passes every link, declared or not)."""
    errors = pack_module(pack, "trainer_core.core.errors")
    outputs, _, control = edit_run
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRAPreview"]()
    with pytest.raises(errors.UserInputError, match=r"this trainer trains edit-2511\. Replace the node with "
                                                    r"Qwen LoRA Preview \(Edit\) \(QwenLoRAEditPreview\)"):
        node.preview(outputs["7"][0], **SETTINGS)
    with pytest.raises(errors.UserInputError, match=r"control_image_1: Qwen LoRA Preview no longer takes control "
                                                    r"images\. Replace the node with Qwen LoRA Preview \(Edit\)"):
        node.preview(outputs["7"][0], **SETTINGS, control_image_1=as_image(control))


def test_edit_preview_refuses_a_text_to_image_trainer_naming_the_preview(pack, trained_lora):
    errors = pack_module(pack, "trainer_core.core.errors")
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRAEditPreview"]()
    with pytest.raises(errors.UserInputError, match=r"this trainer trains qwen-image, a text-to-image model: use "
                                                    r"Qwen LoRA Preview \(QwenLoRAPreview\) instead"):
        node.preview(trained_lora, **SETTINGS)
