"""Qwen-Image-2512 (ComfyUI 0.33.0's text-to-image template loads `qwen_image_2512_fp8_e4m3fn.safetensors`): the
architecture and tensor names of Qwen-Image, new weights. So its files are Qwen-Image files under another name:
a run file (and the Load node, which calls the same loader) trains on them as on Qwen-Image's, and ComfyUI loads
the LoRA into the model it builds for them. The tiny model stands in, exported under the 2512 names
(`export-tiny --model qwen-image-2512`).

The host part needs COMFYUI_PATH (ComfyUI 0.33.0) and COMFYUI_PYTHON, as tests/host/test_host_layouts.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from test_headless import same_tensors, tiny_run_file

COMFYUI = os.environ.get("COMFYUI_PATH")
STEPS = 2


@pytest.fixture(scope="module")
def files_2512(tmp_path_factory):
    """`python -m trainer_core export-tiny DIR --model qwen-image-2512`, in process: name -> path, as it prints them."""
    import contextlib
    import io

    from trainer_core.runs.cli import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["export-tiny", str(tmp_path_factory.mktemp("tiny_2512")), "--model", "qwen-image-2512"]) == 0
    return {name: Path(path) for name, path in (line.split(": ", 1) for line in printed.getvalue().splitlines())}


def train_on(files: dict[str, Path], folder: Path, images: Path, capsys) -> tuple[Path, str]:
    """`python -m trainer_core train` on `files` (float8 transformer, scaled fp8 encoder): the LoRA and the output."""
    from trainer_core.runs.cli import main

    model = {"transformer": str(files["transformer_fp8_e4m3fn"]), "text_encoder": str(files["text_encoder_fp8_scaled"]),
             "vae": str(files["vae"]), "source": ""}
    path = tiny_run_file(folder, images, model=model, train={"steps": STEPS},
                         optimizer={"learning_rate": 1e-3, "ema": True, "ema_decay": 0.9})
    assert main(["train", "--config", str(path), "--output", str(folder / "out")]) == 0
    return folder / "out" / "t" / f"t_{STEPS:06d}.safetensors", capsys.readouterr().out


def test_export_tiny_names_the_files_as_comfyuis_2512_release(files_2512):
    assert Path(files_2512["transformer_fp8_e4m3fn"]).name == "qwen_image_2512_tiny_fp8_e4m3fn.safetensors"
    assert Path(files_2512["transformer_bf16"]).name == "qwen_image_2512_tiny_bf16.safetensors"


def test_a_run_file_trains_on_2512_files_exactly_as_on_qwen_image_files(files_2512, tiny_files, demo_folder,
                                                                       tmp_path, capsys):
    """Same tensors under the 2512 names: the same LoRA, bit for bit (and its EMA file beside it)."""
    lora_2512, printed = train_on(files_2512, tmp_path / "a", demo_folder, capsys)
    assert "model: qwen_image_2512_tiny_fp8_e4m3fn" in printed
    lora_qwen, _ = train_on(tiny_files, tmp_path / "b", demo_folder, capsys)
    assert same_tensors(lora_2512, lora_qwen)
    ema = lora_2512.with_name(lora_2512.stem + "_ema.safetensors")
    assert load_file(str(ema)).keys() == load_file(str(lora_2512)).keys()


@pytest.mark.skipif(not COMFYUI, reason="COMFYUI_PATH is not set: point it at ComfyUI 0.33.0 (and COMFYUI_PYTHON at "
                                        "a Python with its requirements)")
def test_comfyui_builds_its_qwen_image_for_2512_files_and_loads_the_lora_with_no_key_left(
        files_2512, demo_folder, tmp_path, capsys):
    from comfy_probe import run_probe
    from test_host_layouts import TOLERANCE, our_outputs, probe_inputs
    from trainer_core.models.tokenizer import load_tokenizer

    lora, _ = train_on(files_2512, tmp_path / "train", demo_folder, capsys)
    transformers = {k: str(v) for k, v in files_2512.items() if k.startswith("transformer_")}
    detect = {"files": transformers, "out": str(tmp_path / "detected.json")}
    (tmp_path / "detect.json").write_text(json.dumps(detect))
    run_probe("comfy_detect_probe.py", COMFYUI, tmp_path / "detect.json", timeout=600)
    detected = json.loads((tmp_path / "detected.json").read_text())
    for name in transformers:  # ComfyUI's Qwen-Image (not Edit-2511, not Layered: no marker key)
        assert detected[name]["model"] == "QwenImage", (name, detected[name])
        assert detected[name]["unet_config"]["image_model"] == "qwen_image"
        assert "default_ref_method" not in detected[name]["unet_config"]

    # ComfyUI's own modules load the 2512 files strictly, compute what ours do, and its LoRA loader takes every
    # key of the LoRA trained on them, each weight changed by alpha / rank * B @ A.
    tokenizer = load_tokenizer(files_2512["tokenizer"], files_2512["text_encoder_bf16"], vocab_rows=10**9)
    inputs = probe_inputs(tokenizer)
    save_file(inputs, str(tmp_path / "inputs.safetensors"))
    request = {"files": {k: str(v) for k, v in files_2512.items()}, "inputs": str(tmp_path / "inputs.safetensors"),
               "out": str(tmp_path / "comfy_out.safetensors"), "loras": {"comfyui": str(lora)}}
    (tmp_path / "request.json").write_text(json.dumps(request))
    run_probe("comfy_layout_probe.py", COMFYUI, tmp_path / "request.json", timeout=600)
    theirs = load_file(request["out"])
    assert theirs.pop("lora_keys_not_loaded").item() == 0
    tensors = load_file(str(lora))
    modules = sorted(k[:-len(".lora_A.weight")] for k in tensors if k.endswith(".lora_A.weight"))
    patched = {k[len("lora.comfyui."):]: theirs.pop(k) for k in list(theirs) if k.startswith("lora.comfyui.")}
    assert sorted(patched) == [f"{m}.weight" for m in modules]
    for m in modules:
        a, b = tensors[f"{m}.lora_A.weight"].float(), tensors[f"{m}.lora_B.weight"].float()
        delta = tensors[f"{m}.alpha"].float() / a.shape[0] * b @ a
        assert (patched[f"{m}.weight"] - delta).abs().max().item() < 1e-6, m
    print(f"2512 LoRA: {len(tensors)} keys, {len(patched)} weights patched by ComfyUI, 0 keys not loaded")
    ours = our_outputs(files_2512, inputs)
    for name in ours:
        assert (ours[name] - theirs[name]).abs().max().item() <= TOLERANCE[name], name
