"""The standalone command line: `python -m trainer_core demo` in a fresh process."""

import subprocess
import sys

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
