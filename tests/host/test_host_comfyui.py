"""Host test: a real ComfyUI runs the example workflow with this pack installed.

Needs COMFYUI_PATH (a ComfyUI checkout) and, unless ComfyUI's requirements are installed in this
Python, COMFYUI_PYTHON (a Python that has them). ComfyUI is started on the CPU, on a loopback port,
with --base-directory pointing at a temporary folder (models, custom_nodes, input, output), so the
checkout itself is never written to.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import REPO, WORKFLOW_STEMS, api_workflow
from test_nodes import tiny_prompt

COMFYUI = os.environ.get("COMFYUI_PATH")
FRONTEND_ROOT = os.environ.get("COMFYUI_FRONTEND_ROOT")
pytestmark = pytest.mark.skipif(
    not COMFYUI, reason="COMFYUI_PATH is not set: point it at a ComfyUI checkout (and COMFYUI_PYTHON at a Python "
                        "with ComfyUI's requirements) to run the workflow in a real ComfyUI")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyServer:
    def __init__(self, base: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = base / "comfyui.log"
        python = os.environ.get("COMFYUI_PYTHON", sys.executable)
        self.proc = subprocess.Popen(
            [python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
             "--base-directory", str(base), "--disable-auto-launch",
             # COMFYUI_FRONTEND_ROOT: a frontend's static folder (e.g. the comfyui-frontend-package that ComfyUI's
             # requirements pin, installed with pip --target) instead of the one in COMFYUI_PYTHON
             *(["--front-end-root", FRONTEND_ROOT] if FRONTEND_ROOT else [])],
            cwd=COMFYUI, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def post(self, path: str, payload: dict):
        req = urllib.request.Request(self.url + path, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
            return json.loads(body) if body.strip() else None  # /interrupt answers with an empty body

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited early:\n{self.log()[-3000:]}")
            try:
                self.get("/object_info/QwenLoRATrain")
                return
            except (OSError, ValueError):
                time.sleep(1)
        raise TimeoutError(f"ComfyUI did not start:\n{self.log()[-3000:]}")

    def run(self, prompt: dict, timeout: float = 600) -> dict:
        prompt_id = self.post("/prompt", {"prompt": prompt, "client_id": str(uuid.uuid4())})["prompt_id"]
        deadline = time.time() + timeout
        while time.time() < deadline:
            history = self.get(f"/history/{prompt_id}")
            if prompt_id in history and history[prompt_id].get("status", {}).get("completed") is not None:
                return history[prompt_id]
            time.sleep(0.5)
        raise TimeoutError(f"prompt {prompt_id} did not finish:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def comfy_base(tmp_path):
    base = tmp_path / "comfy_base"
    (base / "custom_nodes").mkdir(parents=True)
    (base / "custom_nodes" / "qwen_image_lora_trainer").symlink_to(REPO, target_is_directory=True)
    # The tiny model as ComfyUI single files in ComfyUI's own model folders (diffusion_models, ...).
    from trainer_core.families import get_family

    get_family("qwen-image").export_tiny(base / "models", layout="comfyui")
    return base


@pytest.fixture
def comfy(comfy_base):
    server = ComfyServer(comfy_base)
    try:
        server.wait_ready()
        yield server, comfy_base
    finally:
        server.stop()


def lora_steps(base: Path) -> list[int]:
    return sorted(int(p.stem.rsplit("_", 1)[1]) for p in (base / "models" / "loras").glob("*.safetensors"))


def latest_checkpoint_step(base: Path, run_name: str) -> int:
    latest = base / "output" / "qwen_lora_training" / "runs" / run_name / "checkpoints" / "latest.json"
    return json.loads(latest.read_text())["step"]


def test_workflow_runs_in_real_comfyui(comfy, tmp_path, demo_folder):
    server, base = comfy
    assert "QwenLoRATrain" in server.get("/object_info/QwenLoRATrain")
    prompt = tiny_prompt(tmp_path, demo_folder, steps=3, from_files=True)
    first = server.run(prompt)
    assert first["status"]["status_str"] == "success", json.dumps(first["status"], indent=1)[-3000:]
    loras = sorted((base / "models" / "loras").glob("*.safetensors"))
    assert [p.name.rsplit("_", 1)[1] for p in loras] == ["000003.safetensors"]
    previews = sorted((base / "output" / "qwen_lora").glob("preview*.png"))
    assert len(previews) == 1

    # Queue the same graph again: only the train node (and what follows) runs, three steps further on.
    second = server.run(prompt)
    assert second["status"]["status_str"] == "success"
    names = sorted(p.name.rsplit("_", 1)[1] for p in (base / "models" / "loras").glob("*.safetensors"))
    assert names == ["000003.safetensors", "000006.safetensors"]
    assert len(list((base / "output" / "qwen_lora").glob("preview*.png"))) == 2
    assert "lora key not loaded" not in server.log()

    # A Release node after Save and Preview gives the run's memory back; the next queue's Init Trainer
    # runs again (its IS_CHANGED moved) and resumes the run from its checkpoint.
    run_name = prompt["6"]["inputs"]["run_name"]
    prompt["15"] = {"class_type": "QwenLoRARelease",
                    "inputs": {"trainer": ["7", 0], "saved_lora": ["10", 0], "preview": ["8", 0]}}
    third = server.run(prompt)
    assert third["status"]["status_str"] == "success", json.dumps(third["status"], indent=1)[-3000:]
    assert f"released run '{run_name}' at step 9" in server.log()
    fourth = server.run(prompt)
    assert fourth["status"]["status_str"] == "success", json.dumps(fourth["status"], indent=1)[-3000:]
    assert f"resumed run '{run_name}' from its checkpoint at step 9" in server.log()
    assert lora_steps(base)[-1] == 12


def test_cancel_and_restart_continue_the_run_in_real_comfyui(comfy_base, tmp_path, demo_folder):
    prompt = tiny_prompt(tmp_path, demo_folder, steps=2, from_files=True)
    run_name = prompt["6"]["inputs"]["run_name"]
    server = ComfyServer(comfy_base)
    try:
        server.wait_ready()
        assert server.run(prompt)["status"]["status_str"] == "success"

        # A long chunk, cancelled after a moment: it stops at a step boundary and checkpoints there.
        prompt["7"]["inputs"]["steps"] = 5000
        prompt_id = server.post("/prompt", {"prompt": prompt, "client_id": "t"})["prompt_id"]
        time.sleep(4)
        server.post("/interrupt", {})
        deadline = time.time() + 120
        while prompt_id not in server.get(f"/history/{prompt_id}") and time.time() < deadline:
            time.sleep(0.5)
        stopped = latest_checkpoint_step(comfy_base, run_name)
        assert 2 < stopped < 5002

        # The next queue continues from there.
        prompt["7"]["inputs"]["steps"] = 2
        assert server.run(prompt)["status"]["status_str"] == "success"
        assert lora_steps(comfy_base)[-1] == stopped + 2
    finally:
        server.stop()

    # A restart loses every trainer in memory: Init Trainer resumes from the checkpoint.
    server = ComfyServer(comfy_base)
    try:
        server.wait_ready()
        prompt["7"]["inputs"]["steps"] = 3
        done = server.run(prompt)
        assert done["status"]["status_str"] == "success", json.dumps(done["status"])[-2000:]
        assert lora_steps(comfy_base)[-1] == stopped + 5
        assert f"resumed run '{run_name}' from its checkpoint at step {stopped + 2}" in server.log()
    finally:
        server.stop()


@pytest.mark.skipif(not shutil.which("chromium"), reason="chromium is not installed (apt-get install chromium)")
@pytest.mark.parametrize("stem", [p.stem for p in sorted((REPO / "example_workflows").glob("*.json"))])
def test_ui_workflow_loads_in_the_real_canvas_as_its_api_twin(comfy, stem):
    """The canvas (ComfyUI's own frontend, headless Chromium) loads each UI workflow from the template
    route with every node known, keeps the stored node sizes (none smaller than the canvas computes for
    its sockets and widgets), draws every title uncut and every line of the Note in its box, and converts it into
    exactly the API-format twin (the Note left out)."""
    server, _ = comfy
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    template = f"/api/workflow_templates/qwen_image_lora_trainer/{stem}.json"
    out = subprocess.run([python, str(Path(__file__).with_name("canvas_check.py")), server.url, template,
                          shutil.which("chromium")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "error" not in result, json.dumps(result)[:3000]
    assert not [n for n in result["nodes"] if n["missing"]]
    assert not result["errors"], result["errors"]  # loading it threw nothing (boot_errors: the frontend's own)
    stored = {str(n["id"]): n for n in json.loads((REPO / "example_workflows" / f"{stem}.json").read_text())["nodes"]}
    changed = [(n["id"], n["type"], stored[str(n["id"])]["size"], n["size"], n["least"]) for n in result["nodes"]
               if n["size"] != stored[str(n["id"])]["size"] or n["pos"] != stored[str(n["id"])]["pos"]
               or n["size"][0] < n["least"][0] - 1 or n["size"][1] < n["least"][1] - 1]
    assert not changed, f"(id, type, stored size, canvas size, least size): {changed}"
    cut = [(t["id"], t["title"], round(t["room"])) for t in result["titles"] if t["room"] < 0]
    assert not cut, f"titles the canvas cuts (id, title, px short): {cut}"
    assert result["notes"] and all(0 < n["client"] and n["scroll"] <= n["client"] for n in result["notes"]), \
        f"a Note that hides lines (its box, the height its lines need): {result['notes']}"
    held = [str(i) for g in result["groups"] for i in g["nodes"]]
    assert len(result["groups"]) == 5 and len(held) == len(set(held))  # no node in two groups
    assert set(held) == {str(n["id"]) for n in result["nodes"] if n["type"] != "Note"}, result["groups"]
    twin = json.loads((REPO / "example_workflows" / "api" / f"{stem}.api.json").read_text())

    def declared(class_type):  # inputs the server declares (the canvas adds display-only widgets, e.g. PreviewAny's)
        spec = server.get(f"/object_info/{class_type}")[class_type]["input"]
        return {**spec.get("required", {}), **spec.get("optional", {})}

    canvas = {k: {"class_type": v["class_type"],
                  "inputs": {n: x for n, x in v["inputs"].items() if n in declared(v["class_type"])}}
              for k, v in result["output"].items()}
    assert canvas == {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in twin.items()}


def test_dataset_in_the_input_folder_validation_and_short_error_names_in_real_comfyui(comfy, tmp_path, demo_folder):
    """A relative dataset folder is found in ComfyUI's input folder (ComfyUI runs in another working
    directory), a held-out image gives a validation curve, and an error shows as qwen_lora.UserInputError
    with the absolute folder it looked in."""
    server, base = comfy
    shutil.copytree(demo_folder, base / "input" / "shapes")
    prompt = tiny_prompt(tmp_path, demo_folder, steps=2, from_files=True)
    prompt["2"]["inputs"].update(folder="shapes", validation_images=1)
    prompt["6"]["inputs"].update(validation_every=1)
    done = server.run(prompt)
    assert done["status"]["status_str"] == "success", json.dumps(done["status"], indent=1)[-3000:]
    report = done["outputs"]["14"]["text"][0]
    assert "validation loss" in report and "at step 2" in report, report
    choices = server.get("/object_info/QwenLoRADataset")["QwenLoRADataset"]["input"]["optional"]["input_folder"][0]
    assert "shapes" in choices

    prompt["2"]["inputs"].update(folder="nope")
    failed = server.run(prompt)
    assert failed["status"]["status_str"] == "error"
    error = next(m[1] for m in failed["status"]["messages"] if m[0] == "execution_error")
    assert error["exception_type"] == "qwen_lora.UserInputError", error["exception_type"]
    assert str((base / "input" / "nope").resolve()) in error["exception_message"], error["exception_message"]


def test_live_previews_arrive_while_train_steps_runs_and_compare_steps_after_in_real_comfyui(comfy, tmp_path,
                                                                                           demo_folder):
    """ComfyUI sends a node's progress preview to the client that queued the prompt as binary websocket
    frames: a probe (ComfyUI's Python, aiohttp) connects as the canvas does and records them while Train
    Steps runs 6 steps with a preview every 2; the Compare Steps image is saved after."""
    from PIL import Image

    server, base = comfy
    prompt = tiny_prompt(tmp_path, demo_folder, steps=6, from_files=True, **{"7": {"preview_every": 2}})
    prompt["16"] = {"class_type": "QwenLoRACompareSteps",
                    "inputs": {"trainer": ["7", 0], "columns": 0, "tile_size": 64}}
    prompt["17"] = {"class_type": "SaveImage", "inputs": {"images": ["16", 0], "filename_prefix": "qwen_lora/compare"}}
    request = tmp_path / "prompt.json"
    request.write_text(json.dumps(prompt))
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    out = subprocess.run([python, str(Path(__file__).with_name("comfy_preview_probe.py")), server.url, str(request)],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result.get("status") == "execution_success", json.dumps(result)[:3000] + server.log()[-3000:]

    # Train Steps (node 7) showed an image after every step: the newest preview (64 px, shown enlarged 8x to 512: the
    # untrained model's at step 1) beside the loss plot.
    frames = [f for f in result["frames"] if f["node"] == "7"]
    composite = 8 * 64 + 8 + 512
    assert [f["value"] for f in frames] == [1, 2, 3, 4, 5, 6], frames
    assert [f["width"] for f in frames] == [composite] * 6, frames
    print(f"\npreview frames of Train Steps: {len(frames)}, each with a sampled preview (steps 0, 2, 4, 6)")

    history = server.get(f"/history/{result['prompt_id']}")[result["prompt_id"]]
    report = history["outputs"]["14"]["text"][0]
    assert "previews at steps 2, 4, 6: " in report and " s each (" in report, report
    saved = history["outputs"]["17"]["images"]
    assert len(saved) == 1
    grid = Image.open(base / "output" / saved[0]["subfolder"] / saved[0]["filename"])
    assert grid.size == (2 * 64, 2 * (64 + 20))  # four tiles (steps 0, 2, 4, 6), two per row, labels under them
    print(f"compare image: {grid.size[0]}x{grid.size[1]}, 4 tiles")


def test_the_tiny_first_run_workflow_runs_as_shipped_in_real_comfyui(comfy, tmp_path):
    """The first-run workflow, unchanged but for its run name, validates and trains in a real ComfyUI: the
    shapes model shipped in the pack's pretrained/ folder, the example stars, the '(not used)' file choices; its
    previews at step 0 (the untrained model) and every 50 steps. ComfyUI lists it first among the pack's templates
    (the pack puts its list in the names' order: ComfyUI's is the folder's)."""
    server, base = comfy
    listed = server.get("/api/workflow_templates")["qwen_image_lora_trainer"]
    assert listed == [WORKFLOW_STEMS[k] for k in ("first_run", "main", "edit", "qwen21", "layered", "regularized",
                                                  "captioned")]
    prompt = json.loads((api_workflow("first_run")).read_text())
    prompt["6"]["inputs"]["run_name"] = f"tiny_{tmp_path.name}"[:60]
    assert "(not used)" in server.get("/object_info/QwenLoRALoadModels")["QwenLoRALoadModels"]["input"][
        "required"]["transformer"][0]
    done = server.run(prompt)
    assert done["status"]["status_str"] == "success", json.dumps(done["status"], indent=1)[-3000:]
    report = " ".join(done["outputs"]["14"]["text"])
    assert "steps 1-200" in report and "previews at steps 50, 100, 150, 200: " in report, report
    assert lora_steps(base)[-1] == 200


def test_the_caption_workflow_captions_then_trains_in_real_comfyui(comfy, tmp_path, demo_folder):
    """The caption-first workflow in a real ComfyUI: Caption Dataset writes the captions the folder lacks with the tiny
    text encoder file's vision-language model (picked from models/text_encoders, its tokenizer beside it), before the
    Dataset node (its folder wired from Caption Dataset) reads the folder; the captions kept stay byte for byte; the
    run trains on the captions written, and a second queue with a caption edited on disk keeps the edit."""
    from test_caption_node import captioned_prompt, three_captions_removed

    server, base = comfy
    folder, removed, kept = three_captions_removed(demo_folder, tmp_path / "images")
    encoder = next((base / "models" / "text_encoders").glob("*fp8_scaled.safetensors")).name
    prompt = captioned_prompt(tmp_path, folder, encoder)
    done = server.run(prompt)
    assert done["status"]["status_str"] == "success", json.dumps(done["status"], indent=1)[-3000:]
    assert all(p.exists() and p.read_bytes() for p in removed)
    assert {name: (folder / name).read_bytes() for name in kept} == kept
    report = " ".join(done["outputs"]["23"]["text"])
    assert f"8 images in {folder}: 3 written, 0 replaced" in report, report
    assert lora_steps(base)[-1] == 2
    removed[0].write_text("edited by hand", encoding="utf-8")
    again = server.run(prompt)
    assert again["status"]["status_str"] == "success", json.dumps(again["status"], indent=1)[-3000:]
    assert f"{removed[0].with_suffix('.png').name}: (kept) edited by hand" in " ".join(again["outputs"]["23"]["text"])
    assert removed[0].read_text(encoding="utf-8") == "edited by hand"


@pytest.fixture
def comfy_edit(tmp_path):
    """A ComfyUI with the tiny Edit-2511 as ComfyUI single files, the built-in edit dataset in its input folder
    and a picture to edit there (for a Load Image)."""
    from trainer_core.families import get_family
    from trainer_core.families.qwen_image_edit.demo import make_edit_demo_dataset

    base = tmp_path / "comfy_edit_base"
    (base / "custom_nodes").mkdir(parents=True)
    (base / "custom_nodes" / "qwen_image_lora_trainer").symlink_to(REPO, target_is_directory=True)
    files = get_family("edit-2511").export_tiny(base / "models")
    make_edit_demo_dataset(base / "input" / "edit_dataset")
    shutil.copy(base / "input" / "edit_dataset" / "00_red_circle_control.png", base / "input" / "to_edit.png")
    server = ComfyServer(base)
    try:
        server.wait_ready()
        yield server, base, files
    finally:
        server.stop()


def test_edit_workflow_trains_previews_a_canvas_image_and_its_lora_loads_on_the_edit_model_in_real_comfyui(
        comfy_edit, tmp_path):
    """The Edit workflow as shipped, pointed at the tiny Edit-2511 files (the variant read from the file) and the
    edit dataset, trains in a real ComfyUI; Preview (Edit) edits a Load Image from the canvas (the text-to-image
    Preview refuses an older workflow's control image link, naming it); ComfyUI's own model
    detection reads 2511 from the file, its transformer class has exactly the file's keys, and its LoRA code
    loads the saved LoRA on that model with 0 unmatched keys."""
    from comfy_probe import run_probe

    server, base, files = comfy_edit
    prompt = json.loads((api_workflow("edit")).read_text())
    prompt["1"]["inputs"].update(transformer=files["transformer_fp8_e4m3fn_scaled"].name,
                                 text_encoder=files["text_encoder_fp8_scaled"].name, vae=files["vae"].name,
                                 compute_dtype="float32", storage="float32")
    prompt["2"]["inputs"].update(folder="edit_dataset", resolution=64, min_bucket_side=32, max_bucket_side=128,
                                 control_resolution=96)
    prompt["3"]["inputs"].update(preview_prompts="paint the circle red", cache_folder="qwen_lora_training/edit_cache")
    prompt["6"]["inputs"].update(run_name=f"edit_{tmp_path.name}"[:60], blocks_to_swap=0, gradient_checkpointing=False)
    prompt["7"]["inputs"].update(steps=4, preview_every=2, preview_size=64, preview_sampling_steps=2)
    prompt["8"]["inputs"].update(width=64, height=64, steps=3, control_image_1=["20", 0])
    prompt["20"] = {"class_type": "LoadImage", "inputs": {"image": "to_edit.png"}}
    done = server.run(prompt)
    assert done["status"]["status_str"] == "success", json.dumps(done["status"], indent=1)[-3000:]
    assert lora_steps(base)[-1] == 4
    assert len(list((base / "output" / "qwen_lora").glob("preview*.png"))) == 1
    lora = sorted((base / "models" / "loras").glob("*.safetensors"))[-1]

    # An older Edit workflow: the control image wired into the text-to-image Preview. ComfyUI still hands the
    # node that link (it passes undeclared links); the node refuses it, naming the Edit Preview to use.
    old = {k: v for k, v in prompt.items() if k != "10"}  # no second LoRA file (the probe reads the first)
    old["8"] = {**prompt["8"], "class_type": "QwenLoRAPreview"}
    failed = server.run(old)
    assert failed["status"]["status_str"] == "error"
    error = next(m[1] for m in failed["status"]["messages"] if m[0] == "execution_error")
    assert error["exception_type"] == "qwen_lora.UserInputError" and error["node_type"] == "QwenLoRAPreview", error
    assert "control_image_1: Qwen LoRA Preview no longer takes control images. Replace the node with Qwen LoRA " \
           "Preview (Edit) (QwenLoRAEditPreview)" in error["exception_message"], error["exception_message"]

    request = tmp_path / "edit_probe.json"
    request.write_text(json.dumps({"transformer": str(files["transformer_bf16"]), "lora": str(lora)}))
    result = json.loads(run_probe("comfy_edit_probe.py", COMFYUI, request, timeout=600).stdout.strip().splitlines()[-1])
    assert not result["missing"], result
    from safetensors.torch import load_file

    assert result["patched"] == len(load_file(str(lora))) // 3  # every module of the file (A, B, alpha) patched
    assert result["lora_keys_not_loaded"] == 0, result
    version = (Path(COMFYUI) / "comfyui_version.py").read_text() if (Path(COMFYUI) / "comfyui_version.py").exists() else ""
    if "0.3.64" not in version:  # ComfyUI 0.33 reads Edit-2511 from the marker key, and its class has that buffer
        assert result["ref_method"] == "index_timestep_zero" and result["same_keys"], result
    else:  # 0.3.64 knows no 2511: the marker is the one key its class lacks (its loader logs and skips it)
        assert result["ref_method"] is None and result["unexpected"] == ["__index_timestep_zero__"], result


def test_a_dataset_mix_runs_in_real_comfyui(comfy, tmp_path, demo_folder):
    """Two Dataset nodes (the second a weighted regularisation set) into Dataset Mix into Cache: ComfyUI validates
    the mix's DATASET sockets (two required, two optional left unconnected) and the run trains."""
    from test_dataset_mix import mixed_prompt

    server, base = comfy
    info = server.get("/object_info/QwenLoRADatasetMix")["QwenLoRADatasetMix"]["input"]
    assert (sorted(info["required"]), sorted(info["optional"])) == (["dataset_1", "dataset_2"],
                                                                    ["dataset_3", "dataset_4"])
    reg = tmp_path / "reg"
    reg.mkdir()
    for path in sorted(demo_folder.iterdir())[:8]:
        shutil.copy(path, reg / path.name)
    result = server.run(mixed_prompt(tmp_path, demo_folder, reg, from_files=True))
    assert result["status"]["status_str"] == "success", json.dumps(result["status"], indent=1)[-3000:]
    assert lora_steps(base) == [2]
