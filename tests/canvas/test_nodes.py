"""The nodes, loaded as ComfyUI loads the pack: definitions, and the example workflow run end to end."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from comfy_lora_rules import comfy_key_map, unmatched_keys
from conftest import api_workflow
from graph_runner import GraphRunner, RecordImages

# Node ids of ComfyUI core that a custom node with the same id would silently replace or lose to.
CORE_IDS = {"TrainLoraNode", "SaveLoRA", "SaveLoRANode", "LoraModelLoader", "LossGraphNode", "LoraLoader",
            "LoraLoaderModelOnly", "KSampler", "SaveImage", "PreviewImage", "LoadImage"}

API_WORKFLOW = api_workflow("main")


def test_pack_imports_like_comfyui_and_exposes_prefixed_nodes(pack):
    mappings = pack.NODE_CLASS_MAPPINGS
    assert len(mappings) == 19  # 12 + the three Qwen-Image-Edit nodes (Load Edit, Edit Dataset, Edit Preview) + Layered Dataset + Dataset Mix + Caption Dataset + Images to Dataset
    assert set(mappings) == set(pack.NODE_DISPLAY_NAME_MAPPINGS)
    assert all(name.startswith("QwenLoRA") for name in mappings)
    assert not set(mappings) & CORE_IDS
    assert "nodes" not in __import__("sys").modules or not hasattr(__import__("sys").modules["nodes"], "QwenLoRATrain")


def test_every_node_is_described_and_every_input_has_a_tooltip(pack):
    for name, cls in pack.NODE_CLASS_MAPPINGS.items():
        assert len(cls.DESCRIPTION) > 30, name
        assert cls.CATEGORY and cls.FUNCTION and hasattr(cls, cls.FUNCTION)
        assert len(cls.OUTPUT_TOOLTIPS) == len(cls.RETURN_TYPES) == len(cls.RETURN_NAMES), name
        for group in cls.INPUT_TYPES().values():
            for input_name, spec in group.items():
                assert len(spec) == 2 and spec[1].get("tooltip"), f"{name}.{input_name} has no tooltip"


# The tiny model as `export-tiny` writes it into a models folder (ComfyUI's layout).
TINY_FILES = {"transformer": "qwen_image_tiny_fp8_e4m3fn.safetensors",
              "text_encoder": "qwen_2.5_vl_tiny_fp8_scaled.safetensors", "vae": "qwen_image_tiny_vae.safetensors"}


def tiny_prompt(tmp_path, demo_folder, steps=3, from_files=False, workflow=API_WORKFLOW, **overrides):
    """The example API workflow (or `workflow`, another of the same graph), pointed at the tiny model (built in, or the
    exported files when `from_files`) and the demo dataset."""
    prompt = json.loads(workflow.read_text())
    if from_files:
        prompt["1"]["inputs"].update(source="ComfyUI model files", storage="float8", **TINY_FILES)
    else:
        prompt["1"]["inputs"].update(source="tiny test model (random weights)", storage="float8")
    prompt["2"]["inputs"].update(folder=str(demo_folder), resolution=64, min_bucket_side=32, max_bucket_side=128)
    prompt["3"]["inputs"].update(preview_prompts="a red circle on a white background\na blue square",
                                 cache_folder="")
    prompt["6"]["inputs"].update(blocks_to_swap=1, checkpoint_every=0, run_name=f"test_{tmp_path.name}"[:60])
    # Live previews off unless a test turns them on; when on, small and quick.
    prompt["7"]["inputs"].update(steps=steps, preview_every=0, preview_size=64, preview_sampling_steps=2,
                                 snapshot_every=0)
    prompt["8"]["inputs"].update(width=64, height=64, steps=3)
    for node_id, values in overrides.items():
        prompt[node_id]["inputs"].update(values)
    return prompt


@pytest.fixture
def loras_dir(tmp_path, monkeypatch):
    folder = tmp_path / "loras"
    monkeypatch.setenv("QWEN_LORA_LORAS", str(folder))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    return folder


def test_workflow_trains_previews_and_saves_a_comfyui_lora(pack, tmp_path, demo_folder, loras_dir, tiny_files,
                                                           monkeypatch):
    """From the model files, as a ComfyUI user has them (fp8 transformer, fp8-scaled text encoder)."""
    monkeypatch.setenv("QWEN_LORA_MODELS", str(tiny_files["vae"].parents[1]))
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    RecordImages.received.clear()
    outputs = runner.run(tiny_prompt(tmp_path, demo_folder, steps=3, from_files=True))
    trainer = outputs["7"][0]
    assert trainer.step == 3
    assert torch.isfinite(torch.tensor(outputs["7"][1]))
    preview, plot, compare = RecordImages.received  # Preview, Loss Plot, Compare Steps (no live previews yet)
    assert compare.shape[0] == 1 and compare.shape[-1] == 3
    assert preview.shape == (1, 64, 64, 3) and plot.shape[-1] == 3
    status = outputs["6"][1]
    assert status.startswith("started run") and "blocks_to_swap: 1" in status
    assert "CPU training: no GPU memory to plan." in status
    assert 0.0 <= preview.min() and preview.max() <= 1.0
    saved = Path(outputs["10"][0])
    assert saved.parent == loras_dir and saved.name.endswith("_000003.safetensors")
    base_keys = {k for k in trainer.components.transformer.state_dict() if ".lora_" not in k}
    base_keys = {k.replace(".base_layer", "") for k in base_keys}
    assert unmatched_keys(load_file(str(saved)).keys(), comfy_key_map(base_keys)) == []


def test_the_tiny_first_run_workflow_runs_as_shipped_and_its_loss_falls(pack, tmp_path, loras_dir, monkeypatch):
    """The second example workflow needs no model file and no dataset of the user's: the built-in tiny model
    and the example images shipped with the pack. Its first queue (here cut to 20 of its steps) lowers the
    loss and changes the preview from the untrained model's."""
    monkeypatch.setenv("QWEN_LORA_MODELS", str(tmp_path / "no_models"))
    prompt = json.loads((api_workflow("first_run")).read_text())
    prompt["6"]["inputs"]["run_name"] = f"tiny_{tmp_path.name}"[:60]
    prompt["7"]["inputs"]["steps"] = 20
    prompt["8"]["inputs"]["steps"] = 4
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    before = dict(prompt, **{"8": {**prompt["8"], "inputs": {**prompt["8"]["inputs"], "trainer": ["6", 0]}}})
    before = {k: v for k, v in before.items() if k in {"1", "2", "3", "4", "5", "6", "8"}}
    untrained = runner.run(before)["8"][0]
    RecordImages.received.clear()
    outputs = runner.run(prompt)
    trainer = outputs["7"][0]
    losses = [loss for _, loss in trainer.progress.loss_history]
    assert trainer.step == 20 and len(losses) == 20
    # measured: the last 5 average 0.61 x the first 5; the preview moved 0.054 on average
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5, losses
    preview = outputs["8"][0]
    assert preview.shape == untrained.shape == (1, 64, 64, 3)
    assert (preview - untrained).abs().mean() > 0.005
    assert Path(outputs["10"][0]).is_file()
    # Shown and saved enlarged 4x for the eye (Upscale Image By, nearest-exact): each sampled pixel a 4x4 block.
    assert prompt["20"]["class_type"] == "ImageScaleBy" and prompt["11"]["inputs"]["images"] == ["20", 0]
    shown = outputs["20"][0]
    assert torch.equal(shown, preview.repeat_interleave(4, dim=1).repeat_interleave(4, dim=2))


def test_the_regularized_first_run_workflow_mixes_both_example_sets_and_reports_each(pack, tmp_path, loras_dir,
                                                                                    monkeypatch):
    """The first-run workflow with a regularisation set (the Dataset Mix node's shipped example): as shipped (cut to
    6 of its steps) it needs no model file, caches the 8 stars (3 repeats) and the 24 known-shape pictures as one
    dataset, and the loss report keeps each set's mean, the regularisation set's weighted as its node says."""
    monkeypatch.setenv("QWEN_LORA_MODELS", str(tmp_path / "no_models"))
    prompt = json.loads((api_workflow("regularized")).read_text())
    assert prompt["3"]["inputs"]["dataset"] == ["18", 0] and prompt["18"]["class_type"] == "QwenLoRADatasetMix"
    regularization = prompt["17"]["inputs"]
    assert regularization["is_regularization"] and regularization["loss_weight"] < 1.0
    prompt["6"]["inputs"]["run_name"] = f"reg_{tmp_path.name}"[:60]
    prompt["7"]["inputs"].update(steps=6, preview_every=0)
    prompt["8"]["inputs"]["steps"] = 2
    outputs = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)
    summary = outputs["18"][1]
    assert summary.startswith("2 datasets, 32 images in all:") and "(regularisation, loss weight 0.5)" in summary
    trainer = outputs["7"][0]
    assert trainer.step == 6 and len(trainer.progress.dataset_loss_history) == 6
    assert len(trainer.dataset.samples) == 8 + 24
    labels = set().union(*(means for _step, means in trainer.progress.dataset_loss_history))
    assert len(labels) == 2, labels


def test_queueing_again_trains_more_and_loads_nothing_again(pack, tmp_path, demo_folder, loras_dir):
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    prompt = tiny_prompt(tmp_path, demo_folder, steps=2, **{"6": {"blocks_to_swap": -1}})
    first = runner.run(prompt)
    assert "blocks_to_swap: 0" in first["6"][1]  # auto on a CPU: nothing to swap
    trainer = first["7"][0]
    outputs = runner.run(prompt)
    assert outputs["7"][0] is trainer and trainer.step == 4  # the same trainer, two steps further
    # Loaders and cache were cached; Init Trainer ran again (its run trained on) to say the step it continues at,
    # handing on the live trainer (issue 53: its box said "started ... at step 0" after every later queue).
    assert set(runner.executed) == {"6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16"}
    assert outputs["6"][1].startswith(f"continuing run '{prompt['6']['inputs']['run_name']}' at step 2 (still in "
                                      "memory; started run")
    assert "blocks_to_swap: 0" in outputs["6"][1]  # the plan it was opened with, still shown
    outputs = runner.run(prompt)
    assert "at step 4 (still in memory" in outputs["6"][1] and trainer.step == 6


def test_zero_steps_caches_and_builds_but_trains_and_saves_nothing(pack, tmp_path, demo_folder, loras_dir):
    """Workflow 7's first queue (its Note: Train Steps' steps at 0): captions and cache done, nothing trained, no file."""
    outputs = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(tiny_prompt(tmp_path, demo_folder, steps=0))
    assert outputs["7"][0].step == 0 and outputs["7"][2].startswith("0 steps: nothing trained this queue")
    assert outputs["10"][0] == "" and not list(loras_dir.glob("*.safetensors"))
    assert outputs["3"][1].startswith("latents: ")  # the cache was built


def test_a_long_memory_plan_is_summed_up_on_the_canvas_and_kept_whole_in_the_run_folder(pack, tmp_path):
    from conftest import pack_module

    train_nodes = pack_module(pack, "nodes.train_nodes")
    plan = "blocks_to_swap = 3 (the fewest that fit 24.00 GiB)\n\n" + "\n".join(
        ["Memory plan: ...", "total   23.93 GiB", "budget                                    24.00 GiB  fits",
         *[f"line {i}" for i in range(40)], "Every phase fits."])
    status = f"started run 'r' at step 0\nblocks_to_swap: 3 (auto)\n\n{plan}"
    shown = train_nodes.canvas_status(status, tmp_path / "run")
    assert shown.splitlines()[:2] == ["started run 'r' at step 0", "blocks_to_swap: 3 (auto)"]
    assert shown.splitlines()[2] == ("memory plan: Every phase fits. (GPU at the training peak: budget 24.00 GiB fits); "
                                     f"the whole plan: {tmp_path / 'run' / 'memory_plan.txt'} and ComfyUI's console")
    assert (tmp_path / "run" / "memory_plan.txt").read_text() == plan + "\n"
    cpu = "started run 'r' at step 0\nblocks_to_swap: 0\n\nCPU training: no GPU memory to plan."
    assert train_nodes.canvas_status(cpu, tmp_path / "run") == cpu


def test_evicted_init_output_continues_the_live_trainer(pack, tmp_path, demo_folder, loras_dir):
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    prompt = tiny_prompt(tmp_path, demo_folder, steps=2)
    first = runner.run(prompt)["7"][0]
    runner.cache.pop("6")  # ComfyUI dropped the init node's cached output (RAM pressure, /free)
    again = runner.run(prompt)
    assert again["7"][0] is first and first.step == 4
    assert "continuing" in again["6"][1]


def test_training_runs_with_inference_mode_off(pack, tmp_path, demo_folder, loras_dir):
    """Nodes run under torch.inference_mode(); the adapter must still be ordinary trainable tensors."""
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    trainer = runner.run(tiny_prompt(tmp_path, demo_folder, steps=1))["7"][0]
    assert all(not p.is_inference() and p.requires_grad for p in trainer.built.params)
