"""Qwen-Image 2.1 editing on the canvas: the shipped Edit workflow, its Load Edit node pointed at a 2.1 transformer
file (the tiny export), loads 2.1; the Edit Dataset's controls are its references; its Edit Preview shows the shared
sampler's image bit for bit, and the text-to-image Preview refuses the trainer by naming the Edit Preview."""

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from conftest import api_workflow, pack_module

EDIT_WORKFLOW = api_workflow("edit")
RESOLUTION = 288  # as tests/families/test_qwen_image21_edit.py: small references Qwen3-VL's processor keeps as they are


def edit_folder(folder):
    folder.mkdir(parents=True)
    Image.new("RGB", (128, 64), (200, 60, 40)).save(folder / "a.png")
    (folder / "a.txt").write_text("paint the circle red")
    reference = Image.new("RGB", (288, 288), "white")
    ImageDraw.Draw(reference).ellipse((60, 60, 220, 220), fill=(40, 70, 220))
    reference.save(folder / "a_control.png")
    return folder


@pytest.mark.slow
def test_the_edit_workflow_trains_and_previews_a_21_edit_from_its_transformer_file(pack, tmp_path, monkeypatch):
    from graph_runner import GraphRunner
    from trainer_core.families import get_family

    files21 = get_family("qwen-image-2.1").export_tiny(tmp_path / "tiny21", layout="comfyui")
    models = tmp_path / "models"
    (models / "diffusion_models").mkdir(parents=True)
    target = models / "diffusion_models" / "qwen_image_2.1_bf16.safetensors"
    shutil.copy(files21["transformer_bf16"], target)
    shutil.copy(files21["transformer_bf16"].with_suffix(".json"), target.with_suffix(".json"))  # tiny: its RoPE axes
    monkeypatch.setenv("QWEN_LORA_MODELS", str(models))
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    prompt = json.loads(EDIT_WORKFLOW.read_text())
    prompt["1"]["inputs"].update(transformer=target.name, text_encoder="(not used)", vae="(not used)", storage="float32",
                                 compute_dtype="float32", diffusers_folder=str(files21["diffusers_folder"]))
    prompt["2"]["inputs"].update(folder=str(edit_folder(tmp_path / "edit")), resolution=64, min_bucket_side=32,
                                 max_bucket_side=128, control_resolution=RESOLUTION)
    prompt["3"]["inputs"].update(preview_prompts="paint the circle green", cache_folder="")
    prompt["6"]["inputs"].update(run_name="e21", blocks_to_swap=0, gradient_checkpointing=False, checkpoint_every=0)
    prompt["7"]["inputs"].update(steps=2, preview_every=0, snapshot_every=0)
    settings = dict(prompt="", width=64, height=64, steps=2, cfg=4.0, preview_seed=3)
    prompt["8"]["inputs"].update(settings)
    outputs = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)
    trainer = outputs["7"][0]
    try:
        assert trainer.step == 2 and trainer.components.family.name == "qwen-image-2.1"
        assert trainer.dataset.preview_sample.condition_sizes == ((288, 288),)
        ours = trainer.sample_preview("paint the circle green", trainer.dataset.negative_prompt, 64, 64, 2, 4.0, 3)
        shown = outputs["8"][0]  # ComfyUI IMAGE (1, H, W, 3)
        expected = torch.from_numpy(np.asarray(ours.convert("RGB"), dtype=np.float32) / 255.0).unsqueeze(0)
        assert torch.equal(shown, expected)
        given = Image.new("RGB", (288, 288), (250, 250, 40))  # a picture wired in: encoded now, with the prompt
        as_image = torch.from_numpy(np.asarray(given, dtype=np.float32) / 255.0).unsqueeze(0)
        with torch.inference_mode():  # as ComfyUI runs a node
            (wired, _mask) = pack.NODE_CLASS_MAPPINGS["QwenLoRAEditPreview"]().preview(trainer, **settings,
                                                                                 control_image_1=as_image)
        theirs = trainer.sample_preview("paint the circle green", trainer.dataset.negative_prompt, 64, 64, 2, 4.0, 3,
                                        control_images=[given])
        assert torch.equal(wired, torch.from_numpy(np.asarray(theirs.convert("RGB"), dtype=np.float32) / 255.0)[None])
        assert not torch.equal(wired, shown)
        errors = pack_module(pack, "trainer_core.core.errors")
        with pytest.raises(errors.UserInputError, match=r"trains qwen-image-2.1\. Replace the node with Qwen LoRA "
                                                        r"Preview \(Edit\)"):
            pack.NODE_CLASS_MAPPINGS["QwenLoRAPreview"]().preview(trainer, **settings)
    finally:
        trainer.close()


def test_the_load_edit_node_refuses_an_edit_variant_for_a_21_model(pack, tmp_path):
    from trainer_core.families import get_family

    files21 = get_family("qwen-image-2.1").export_tiny(tmp_path / "tiny21", layout="comfyui")
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRALoadEditModels"]()
    errors = pack_module(pack, "trainer_core.core.errors")
    with pytest.raises(errors.UserInputError, match="Qwen-Image 2.1, which has no Edit variants"):
        node.load("diffusers folder", "(not used)", "(not used)", "(not used)", str(files21["diffusers_folder"]),
                  "float32", "float32", "dequantize", "edit-2511")
