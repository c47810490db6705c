"""The standalone command line: `python -m trainer_core demo|export-tiny`, called in process through
`cli.main` (a new process costs its imports, 5-25 s; `python -m trainer_core` itself runs in a new
process in test_resume.py)."""

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file


def test_demo_writes_lora_preview_and_loss_plot(tmp_path, capsys):
    from trainer_core.cli import main

    assert main(["demo", "--steps", "6", "--out", str(tmp_path / "out")]) == 0
    stdout = capsys.readouterr().out
    out = tmp_path / "out"
    for name in ("demo_lora.safetensors", "preview.png", "loss.png"):
        assert str(out / name) in stdout
    assert len(load_file(str(out / "demo_lora.safetensors"))) == 3 * (2 * 14 - 4)
    assert Image.open(out / "preview.png").size == (256, 256)
    assert Image.open(out / "loss.png").size == (768, 384)
    assert "loss: first step" in stdout


def test_cli_help_lists_commands(capsys):
    from trainer_core.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "demo" in capsys.readouterr().out


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
