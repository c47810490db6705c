"""Qwen-Image 2.1's VAE as ComfyUI's single file (families/qwen_image21/vae_file.py), a layout only a newer ComfyUI
reads (comfy/sd.py at Comfy-Org/ComfyUI 033046c: comfy.ldm.wan.vae2_2.WanVAE with temporal kernel 1, patch 1,
RGBA) and diffusers has no converter for: a file written from a diffusers `AutoencoderKLQwenImage21` by the
inverse map loads back bit-exact and decodes (and encodes) exactly as diffusers' VAE with the same weights; the
file's structure is what that ComfyUI detects; Load and export-tiny use it.
"""

import json
import shutil

import pytest
import torch

from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image21.tiny import TINY_VAE

# What ComfyUI's detection reads (sd.py at 033046c): the file is a 2.1 VAE when it has these keys and a 5-D
# decoder.head.2.weight of temporal size 1; then dim = encoder.conv1's rows, dec_dim = decoder.head.0.gamma's,
# image channels = decoder.head.2's rows, and the rest fixed to the published model's.
COMFY_DETECTS = ("decoder.middle.0.residual.0.gamma", "decoder.upsamples.0.upsamples.0.residual.2.weight")
COMFY_REAL = dict(dim=96, dec_dim=144, z_dim=64, dim_mult=[1, 2, 4, 8, 8], num_res_blocks=2,
                  temperal_downsample=[False, True, True, True], image_channels=4)


@pytest.fixture(scope="module")
def vae21():
    from diffusers import AutoencoderKLQwenImage21

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        vae = AutoencoderKLQwenImage21(**TINY_VAE)
        with torch.no_grad():  # gammas off 1, so a norm read from the wrong place would show
            for name, p in vae.named_parameters():
                if name.endswith("gamma"):
                    p.add_(torch.rand_like(p) * 0.5)
    return vae.eval()


def write(vae, path, dtype=torch.float32):
    from safetensors.torch import save_file

    from trainer_core.models.part_files import public_config
    from trainer_core.families.qwen_image21.vae_file import comfyui_vae_tensors

    tensors = comfyui_vae_tensors(vae, dtype)
    save_file(tensors, str(path))
    path.with_suffix(".json").write_text(json.dumps({"part": "vae", "config": public_config(vae.config)}))
    return tensors


def test_the_file_is_what_comfyui_detects_as_the_21_vae(vae21, tmp_path):
    tensors = write(vae21, tmp_path / "vae.safetensors")
    assert all(k in tensors for k in COMFY_DETECTS)
    head = tensors["decoder.head.2.weight"]
    assert head.ndim == 5 and head.shape[2] == 1 and head.shape[0] == 4  # RGBA out
    assert tensors["encoder.conv1.weight"].shape[:3] == (TINY_VAE["base_dim"], 4, 1)
    assert tensors["decoder.head.0.gamma"].shape[0] == TINY_VAE["decoder_base_dim"]
    assert len(tensors) == len(vae21.state_dict())
    # CausalConv3d weights 5-D, Conv2d ones (resamples, attention) 4-D, norms as in diffusers
    assert tensors["encoder.downsamples.1.downsamples.1.time_conv.weight"].ndim == 5
    assert tensors["decoder.upsamples.0.upsamples.2.time_conv.weight"].shape == (24 * 2, 24, 1, 1, 1)
    assert tensors["encoder.downsamples.0.downsamples.1.resample.1.weight"].ndim == 4
    assert tensors["decoder.middle.1.to_qkv.weight"].ndim == 4 and tensors["decoder.middle.1.norm.gamma"].ndim == 3


def test_a_file_from_diffusers_weights_loads_back_bit_exact_and_decodes_as_diffusers(vae21, tmp_path):
    from trainer_core.families.qwen_image21.vae_file import QwenImage21VaeFile

    write(vae21, tmp_path / "vae.safetensors")
    ours = QwenImage21VaeFile(tmp_path / "vae.safetensors", torch.float32)()
    theirs = vae21.state_dict()
    assert sorted(ours.state_dict()) == sorted(theirs)
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    from trainer_core.models.part_files import public_config

    assert public_config(ours.config) == public_config(vae21.config)  # (diffusers' bookkeeping keys aside)
    generator = torch.Generator().manual_seed(3)
    z = torch.randn(1, TINY_VAE["z_dim"], 1, 4, 6, generator=generator)
    image = torch.rand(1, 4, 1, 64, 96, generator=generator) * 2 - 1
    with torch.no_grad():
        assert torch.equal(ours.decode(z).sample, vae21.decode(z).sample)
        assert torch.equal(ours.encode(image).latent_dist.mean, vae21.encode(image).latent_dist.mean)


def test_a_bf16_file_holds_the_bf16_values(vae21, tmp_path):
    from trainer_core.families.qwen_image21.vae_file import QwenImage21VaeFile

    write(vae21, tmp_path / "vae.safetensors", torch.bfloat16)
    ours = QwenImage21VaeFile(tmp_path / "vae.safetensors", torch.float32)()
    theirs = vae21.state_dict()
    assert all(torch.equal(t, theirs[n].bfloat16().float()) for n, t in ours.state_dict().items())


def test_the_real_size_config_is_comfyuis_and_diffusers_default():
    """From the real model's shapes alone (no JSON): ComfyUI's ddconfig, and diffusers' defaults (whose
    latents_mean/std are the published 2.1's)."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKLQwenImage21

    from trainer_core.families.qwen_image21.vae_file import comfyui_name, config_from_shapes, is_5d

    with init_empty_weights():
        real = AutoencoderKLQwenImage21()
    shapes = {}
    for name, t in real.state_dict().items():
        theirs, shape = comfyui_name(name, real.config.num_res_blocks), tuple(t.shape)
        shapes[theirs] = shape[:2] + (1,) + shape[2:] if is_5d(theirs, len(shape)) else shape
    config = config_from_shapes(shapes, None, "real")
    assert (config["base_dim"], config["decoder_base_dim"], config["z_dim"], config["dim_mult"],
            config["num_res_blocks"], config["temperal_downsample"], config["out_channels"]) == tuple(COMFY_REAL.values())
    assert all(real.config[k] == v for k, v in config.items()), config


def test_other_vae_files_are_refused_by_name(vae21, tmp_path):
    from safetensors.torch import save_file

    from trainer_core.families.qwen_image21.vae_file import QwenImage21VaeFile

    tensors = write(vae21, tmp_path / "vae.safetensors")
    video = {k: (v.repeat(1, 1, 3, 1, 1) if v.ndim == 5 and v.shape[-1] == 3 else v) for k, v in tensors.items()}
    save_file(video, str(tmp_path / "wan22.safetensors"))  # a temporal kernel of 3: Wan 2.2's video VAE
    shutil.copy(tmp_path / "vae.json", tmp_path / "wan22.json")
    with pytest.raises(UserInputError, match="wan22.safetensors.*temporal size"):
        QwenImage21VaeFile(tmp_path / "wan22.safetensors")
    from diffusers import AutoencoderKLQwenImage

    from trainer_core.models.vae_file import vae_file_tensors

    save_file(vae_file_tensors(AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1,
                                                      temperal_downsample=[False])),
              str(tmp_path / "qwen_image_vae.safetensors"))  # Qwen-Image's (Wan 2.1, flat) layout
    with pytest.raises(UserInputError, match="qwen_image_vae.safetensors.*not in the layout of Qwen-Image 2.1"):
        QwenImage21VaeFile(tmp_path / "qwen_image_vae.safetensors")


def test_export_tiny_writes_it_and_load_reads_the_vae_from_it(tmp_path):
    """`export-tiny --model qwen-image-2.1` writes the VAE file; the Load settings with it chosen read the VAE from
    the file (bf16 values, the folder's are float32), even from a folder without vae/."""
    from trainer_core.families import get_family
    from trainer_core.families import get_family
    from trainer_core.families.loading import LoadRequest, load_model_set
    from trainer_core.models.source import FILES

    written = get_family("qwen-image-2.1").export_tiny(tmp_path, layout="comfyui")
    folder = written["diffusers_folder"]
    shutil.rmtree(folder / "vae")
    loaded = load_model_set(LoadRequest(FILES, "cpu", storage="float32", compute_dtype="float32",
                             transformer=str(written["transformer_bf16"]), vae=str(written["vae"]),
                             diffusers_folder=str(folder)))
    assert loaded.family.name == "qwen-image-2.1" and loaded.vae is None  # read when first needed
    tiny = get_family("qwen-image-2.1").tiny_components().vae.state_dict()
    got = loaded.ensure_vae().state_dict()
    assert sorted(got) == sorted(tiny)
    assert all(torch.equal(got[n], t.bfloat16().float()) for n, t in tiny.items())
    assert not all(torch.equal(got[n], t) for n, t in tiny.items())
