"""The standalone command line: `python -m trainer_core demo|export-tiny`."""

import subprocess
import sys

import torch
from PIL import Image
from safetensors.torch import load_file

from conftest import REPO


def run_cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "trainer_core", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_demo_writes_lora_preview_and_loss_plot(tmp_path):
    result = run_cli("demo", "--steps", "6", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    for name in ("demo_lora.safetensors", "preview.png", "loss.png"):
        assert str(out / name) in result.stdout
    assert len(load_file(str(out / "demo_lora.safetensors"))) == 3 * (2 * 14 - 4)
    assert Image.open(out / "preview.png").size == (256, 256)
    assert Image.open(out / "loss.png").size == (768, 384)
    assert "loss: first step" in result.stdout


def test_cli_help_lists_commands():
    result = run_cli("--help")
    assert result.returncode == 0 and "demo" in result.stdout


def test_export_tiny_writes_a_diffusers_folder_that_loads(tmp_path, capsys):
    from trainer_core.cli import main
    from trainer_core.models import load_diffusers_dir

    assert main(["export-tiny", str(tmp_path / "tiny"), "--layout", "diffusers"]) == 0
    assert f"diffusers_folder: {tmp_path / 'tiny'}" in capsys.readouterr().out
    assert load_diffusers_dir(tmp_path / "tiny", storage="float32", compute_dtype=torch.float32).num_blocks == 2


def test_demo_trains_from_single_files(tiny_files, tmp_path, capsys):
    """`demo --transformer --text-encoder --vae` (the files `export-tiny` writes in ComfyUI's layouts)."""
    from trainer_core.cli import main

    code = main(["demo", "--steps", "1", "--out", str(tmp_path / "out"),
                 "--transformer", str(tiny_files["transformer_fp8_e4m3fn"]),
                 "--text-encoder", str(tiny_files["text_encoder_fp8_scaled"]), "--vae", str(tiny_files["vae"]),
                 "--text-encoder-fp8", "keep"])
    out = capsys.readouterr().out
    assert code == 0 and "model: qwen_image_tiny_fp8_e4m3fn" in out
    lora = load_file(str(tmp_path / "out" / "demo_lora.safetensors"))
    assert len(lora) == 3 * (2 * 14 - 4)
    assert main(["demo", "--transformer", str(tiny_files["vae"]), "--text-encoder", str(tiny_files["vae"]),
                 "--vae", str(tiny_files["vae"])]) == 2  # a wrong file: the message, not a traceback
    assert "is not a Qwen-Image transformer" in capsys.readouterr().err
