"""Host check for transparency on Qwen-Image 2.1: ComfyUI's own 2.1 VAE (comfy/sd.py's "Qwen Image 2.1 VAE" branch,
comfy.ldm.wan.vae2_2.WanVAE with four image channels), loaded from our 2.1 VAE file by its VAELoader node, encodes a
transparent RGBA picture to the latents our loader's VAE gives it (the encode the trainer caches:
tests/families/test_qwen_image21_edit.py checks it against the pipeline), an RGB picture as the opaque RGBA ours
encodes (ComfyUI pads alpha with 1, as the pipeline's convert("RGBA") does), and decodes four channels, the alpha
included, as ours does. tests/host/comfy_vae21_probe.py runs ComfyUI's side.

The VAE has the structure ComfyUI builds for every 2.1 VAE file (dim_mult [1, 2, 4, 8, 8], two residual blocks, 64
latent channels; its widths from the file) at small widths, random weights.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw
from safetensors.torch import load_file, save_file

from comfy_probe import run_probe

COMFYUI = os.environ.get("COMFYUI_PATH")
SD = Path("comfy/sd.py")
pytestmark = pytest.mark.skipif(
    not (COMFYUI and (Path(COMFYUI) / SD).is_file() and "Qwen Image 2.1 VAE" in (Path(COMFYUI) / SD).read_text()),
    reason="needs COMFYUI_PATH at a ComfyUI that reads Qwen-Image 2.1's VAE (docs/comfyui_21_host.md builds one), and "
           f"COMFYUI_PYTHON at a Python with its requirements; COMFYUI_PATH is {COMFYUI or 'not set'}")

# ComfyUI's fixed 2.1 structure (comfy/sd.py) at small widths: base 8, decoder 12.
CONFIG = dict(base_dim=8, decoder_base_dim=12, z_dim=64, dim_mult=[1, 2, 4, 8, 8], num_res_blocks=2,
              temperal_downsample=[False, True, True, True], in_channels=4, out_channels=4)
# relative max |ComfyUI - ours| / max |ours|: float32 on both sides (ComfyUI's vae_dtype on the CPU), the same
# convolutions in another order. Measured: latents 7.6e-7 (RGBA) and 7.7e-7 (RGB), decoded 1.7e-6.
TOLERANCE = 1e-5


def picture() -> Image.Image:
    """64 x 64 RGBA: a red disc, a half-transparent blue band, the rest fully transparent (its colour black)."""
    image = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    pen = ImageDraw.Draw(image)
    pen.ellipse((12, 12, 44, 44), fill=(220, 40, 40, 255))
    pen.rectangle((0, 50, 63, 57), fill=(40, 70, 220, 128))
    return image


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(ComfyUI's answer, ours) for the picture and its opaque RGB copy."""
    from diffusers import AutoencoderKLQwenImage21

    from trainer_core.families.qwen_image21.vae_file import QwenImage21VaeFile, comfyui_vae_tensors
    from trainer_core.models.part_files import public_config

    folder = tmp_path_factory.mktemp("vae21_host")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        vae = AutoencoderKLQwenImage21(**CONFIG).eval()
    path = folder / "qwen_image21_small_vae.safetensors"
    save_file(comfyui_vae_tensors(vae, torch.float32), str(path))
    path.with_suffix(".json").write_text(json.dumps({"part": "vae", "config": public_config(vae.config)}))
    ours = QwenImage21VaeFile(path, torch.float32)()  # the trainer's VAE, read back from the file
    rgba = torch.from_numpy(np.asarray(picture(), dtype=np.float32) / 255.0).unsqueeze(0)  # (1, H, W, 4) in [0, 1]
    rgb = torch.from_numpy(np.asarray(picture().convert("RGB"), dtype=np.float32) / 255.0).unsqueeze(0)
    save_file({"rgba": rgba, "rgb": rgb}, str(folder / "images.safetensors"))
    request = {"vae": str(path), "images": str(folder / "images.safetensors"), "out": str(folder / "out.safetensors")}
    (folder / "request.json").write_text(json.dumps(request))
    run_probe("comfy_vae21_probe.py", COMFYUI, folder / "request.json", timeout=600)

    def encode(image):  # (1, H, W, C) in [0, 1] -> our latents (1, 64, h, w), the distribution's mode
        x = image.permute(0, 3, 1, 2) * 2 - 1
        if x.shape[1] == 3:
            x = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)  # models/latents.py: an RGB image is opaque
        with torch.no_grad():
            return ours.encode(x.unsqueeze(2)).latent_dist.mode()[:, :, 0]

    with torch.no_grad():
        latent = encode(rgba)
        decoded = ((ours.decode(latent.unsqueeze(2)).sample[:, :, 0] + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1)
    theirs = load_file(request["out"])
    report = json.loads(Path(request["out"] + ".json").read_text())
    return theirs, {"latent.rgba": latent, "latent.rgb": encode(rgb), "decoded.rgba": decoded}, report


def test_comfyui_reads_our_file_as_the_rgba_21_vae(both):
    _theirs, ours, report = both
    assert report["latent_channels"] == 64 and report["output_channels"] == 4, report
    assert report["model"] == "comfy.ldm.wan.vae2_2", report
    assert relative(ours["latent.rgba"], ours["latent.rgb"]) > 100 * TOLERANCE  # the alpha is in the latent


@pytest.mark.parametrize("name", ["latent.rgba", "latent.rgb", "decoded.rgba"])
def test_comfyuis_2_1_vae_encodes_and_decodes_transparency_as_ours(both, name):
    theirs, ours, _report = both
    got = theirs[name].reshape(ours[name].shape)  # ComfyUI's latents keep a frame axis of 1
    assert relative(got, ours[name]) < TOLERANCE, (name, relative(got, ours[name]))
    if name == "decoded.rgba":
        assert got.shape[-1] == 4  # the alpha comes back
