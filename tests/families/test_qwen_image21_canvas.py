"""Qwen-Image 2.1 on the canvas and headless: the Load path recognises 2.1 from its transformer file (the tiny
export, in ComfyUI's key layout with the MLP fused or split) and takes its text encoder, VAE and processor from a
diffusers 2.1 folder; the shipped workflow's API twin and `run_files/qwen_image21.toml` train on the tiny files.
"""

import json
import shutil
import tomllib

import pytest
import torch

from conftest import REPO, api_workflow
from trainer_core.core.errors import UserInputError
from trainer_core.families.loading import LoadRequest, load_model_set
from trainer_core.families.qwen_image21.recognise import is_qwen_image21_file
from trainer_core.models.source import DIFFUSERS, FILES

FAMILY = "qwen-image-2.1"
API_WORKFLOW = api_workflow("qwen21")
RUN_FILE = REPO / "run_files" / "qwen_image21.toml"
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def files21(tmp_path_factory):
    from trainer_core.families import get_family

    return get_family("qwen-image-2.1").export_tiny(tmp_path_factory.mktemp("tiny21"), layout="comfyui")


def test_every_exported_21_transformer_file_says_21_and_a_qwen_image_file_does_not(files21, tiny_files):
    transformers = [p for name, p in files21.items() if name.startswith("transformer_")]
    assert len(transformers) == 4  # bf16, fp8, scaled fp8 (MLP fused) and bf16 with the MLP split
    assert all(is_qwen_image21_file(p) for p in transformers)
    assert not any(is_qwen_image21_file(p) for name, p in tiny_files.items() if name.startswith("transformer"))
    assert not is_qwen_image21_file(files21["diffusers_folder"] / "missing.safetensors")


@pytest.mark.parametrize("name", ["transformer_bf16", "transformer_bf16_split_mlp"])
def test_a_21_transformer_file_loads_as_21_with_the_folders_other_parts(files21, name):
    from trainer_core.families import get_family

    tiny = get_family(FAMILY).tiny_components(storage="float32")
    components = load_model_set(LoadRequest(FILES, CPU, storage="float32", compute_dtype="float32", transformer=files21[name],
                                 text_encoder="(not used)", vae="(not used)", diffusers_folder=files21["diffusers_folder"]))
    assert components.family.name == FAMILY
    want = {k: v.to(torch.bfloat16).float() for k, v in tiny.transformer.state_dict().items()}  # the file is bf16
    assert components.transformer is None and components.text_encoder is None  # lazy, as Qwen-Image's files
    got = components.ensure_transformer().state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k].float(), want[k]) for k in want)
    assert all(torch.equal(a, b) for a, b in zip(components.vae.state_dict().values(), tiny.vae.state_dict().values()))


def test_a_21_transformer_file_without_its_folder_is_refused_naming_both(files21, tmp_path):
    with pytest.raises(UserInputError, match="is Qwen-Image 2.1: its processor .and its VAE and Qwen3-VL text encoder, unless their files are chosen. are "
                                         "read from") as e:
        load_model_set(LoadRequest(FILES, CPU, transformer=files21["transformer_bf16"], diffusers_folder=str(tmp_path)))
    assert str(files21["transformer_bf16"]) in str(e.value) and "diffusers_folder" in str(e.value)


def test_a_21_diffusers_folder_loads_as_21(files21):
    components = load_model_set(LoadRequest(DIFFUSERS, CPU, storage="float32", compute_dtype="float32",
                                 diffusers_folder=files21["diffusers_folder"]))
    assert components.family.name == FAMILY and components.num_blocks == 2


def int8_files21(files21, folder) -> dict:
    """The tiny 2.1 transformer (its blocks) and text encoder (every Linear and the embeddings) as ComfyUI's int8
    ConvRot files, written by comfy-kitchen (int8_files.py), under the names ComfyUI's 2.1 templates give them."""
    from int8_files import int8_copy

    return {"transformer": int8_copy(files21["transformer_bf16"], folder / "qwen_image_2.1_int8_convrot.safetensors",
                                     lambda k: ".transformer_blocks." in k),
            "text_encoder": int8_copy(files21["text_encoder"], folder / "qwen3vl_8b_int8_convrot.safetensors",
                                      lambda k: True)}


@pytest.mark.slow
@pytest.mark.parametrize("files", ["bf16, encoder from the folder", "bf16", "int8"])
def test_the_shipped_21_workflow_trains_on_the_tiny_files(pack, files21, demo_folder, tmp_path, monkeypatch, files):
    """The 2.1 workflow's API twin as shipped, its model pointed at the tiny export (the
    transformer found in the models folder by the name the workflow gives, as ComfyUI lists it; the text encoder from
    the folder, or its ComfyUI-layout file picked in models/text_encoders) and the demo images. "int8": both files
    as ComfyUI's 2.1 templates download them (int8 ConvRot, written by comfy-kitchen), the blocks kept in int8."""
    from graph_runner import GraphRunner

    models = tmp_path / "models"
    (models / "diffusion_models").mkdir(parents=True)
    prompt = json.loads(API_WORKFLOW.read_text())
    name = prompt["1"]["inputs"]["transformer"]
    assert name == "qwen_image_2.1_int8_convrot.safetensors"  # the name ComfyUI's own 2.1 templates download
    source = int8_files21(files21, tmp_path / "int8")["transformer"] if files == "int8" else files21["transformer_bf16"]
    target = models / "diffusion_models" / name
    shutil.copy(source, target)
    shutil.copy(source.with_suffix(".json"), target.with_suffix(".json"))  # tiny: its RoPE axes
    monkeypatch.setenv("QWEN_LORA_MODELS", str(models))
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    prompt["1"]["inputs"].update(diffusers_folder=str(files21["diffusers_folder"]), storage="float8",
                                 compute_dtype="float32")
    vae = models / "vae" / prompt["1"]["inputs"]["vae"]
    assert vae.name == "qwen_image_2.1_vae_bf16.safetensors"  # ComfyUI's 2.1 VAE file, read by vae_file.py
    vae.parent.mkdir()
    for suffix in (".safetensors", ".json"):
        shutil.copy(files21["vae"].with_suffix(suffix), vae.with_suffix(suffix))
    encoder_file = files != "bf16, encoder from the folder"
    if encoder_file:
        encoder = int8_files21(files21, tmp_path / "int8")["text_encoder"] if files == "int8" else files21["text_encoder"]
        (models / "text_encoders").mkdir()
        for suffix in (".safetensors", ".json"):
            shutil.copy(encoder.with_suffix(suffix), models / "text_encoders" / f"qwen3vl_tiny{suffix}")
        prompt["1"]["inputs"]["text_encoder"] = "qwen3vl_tiny.safetensors"
    else:
        prompt["1"]["inputs"]["text_encoder"] = "(not used)"
    prompt["2"]["inputs"].update(folder=str(demo_folder), resolution=64, min_bucket_side=32, max_bucket_side=128)
    prompt["3"]["inputs"].update(cache_folder="")
    prompt["6"]["inputs"].update(blocks_to_swap=0, checkpoint_every=0, run_name="t21_" + files.split(",")[0])
    prompt["7"]["inputs"].update(steps=2, preview_every=0, preview_size=64, preview_sampling_steps=2, snapshot_every=0)
    prompt["8"]["inputs"].update(width=64, height=64, steps=2)
    outputs = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)
    trainer = outputs["7"][0]
    assert trainer.step == 2 and trainer.components.family.name == FAMILY
    image, mask = outputs["8"]  # the Preview node: the RGBA VAE's alpha as the mask (1 - alpha), not thrown away
    assert image.shape == (1, 64, 64, 3) and mask.shape == (1, 64, 64) and float(mask.max()) > 0
    from trainer_core.models.float8 import FLOAT8, frozen_block_linears

    stored = {lin.weight.dtype for _, lin in frozen_block_linears(trainer.built.transformer)}
    assert stored == ({torch.int8} if files == "int8" else {FLOAT8})  # an int8 file's blocks kept as ComfyUI runs them
    if files != "int8":
        # the encoder from where it was chosen: the file holds bf16 values, the folder the tiny model's float32 ones
        from trainer_core.families import get_family

        embed = get_family(FAMILY).tiny_components().text_encoder.model.language_model.embed_tokens.weight
        read, _ = trainer.components.text_encoder_loader()
        got = read.model.language_model.embed_tokens.weight
        assert torch.equal(got, embed.bfloat16().float() if encoder_file else embed) and not torch.equal(embed.bfloat16().float(), embed)
    from safetensors.torch import load_file

    keys = load_file(outputs["10"][0]).keys()
    # ComfyUI's 2.1 layout: bare module names, the MLP pair on its own names (test_qwen_image21_comfy_keys.py)
    assert any(".img_mlp.gate_layer." in k for k in keys) and not any(k.startswith("diffusion_model.") for k in keys)


@pytest.mark.slow
@pytest.mark.parametrize("files", ["bf16, encoder from the folder", "bf16", "int8"])
def test_the_shipped_21_run_file_trains_on_the_tiny_files(files21, demo_folder, tmp_path, capsys, files):
    """run_files/qwen_image21.toml as shipped, [model] and [[dataset]] pointed at the tiny files and demo images;
    the text encoder from the folder, or from its ComfyUI-layout file; "int8": ComfyUI's int8 ConvRot files of both
    (comfy-kitchen's), the text encoder's int8 Linears kept (text_encoder_fp8 = keep)."""
    from trainer_core.runs.cli import main
    from trainer_core.runs.run_file_toml import render

    data = tomllib.loads(RUN_FILE.read_text())
    assert data["model"]["source"] == "files" and "text_encoder" not in data["model"]
    data["model"].update(transformer=str(files21["transformer_bf16_split_mlp"]),
                         diffusers_folder=str(files21["diffusers_folder"]), compute_dtype="float32")
    if files == "bf16":
        data["model"]["text_encoder"] = str(files21["text_encoder"])
    if files == "int8":
        int8 = int8_files21(files21, tmp_path / "int8")
        data["model"].update(transformer=str(int8["transformer"]), text_encoder=str(int8["text_encoder"]),
                             text_encoder_fp8="keep")
    data["dataset"][0].update(folder=str(demo_folder), resolution=64, min_bucket_side=32, max_bucket_side=128)
    data["train"].update(blocks_to_swap=0)
    data["previews"].update(preview_every=0, preview_size=64)
    path = tmp_path / "run.toml"
    path.write_text(render(data))
    assert main(["train", "--config", str(path), "--output", str(tmp_path / "out"), "--steps", "2"]) == 0
    printed = capsys.readouterr().out
    assert "lora: " in printed
    assert ("qwen_image_2.1_int8_convrot" if files == "int8" else "qwen_image21_tiny") in printed  # named after its file
    if files == "int8":  # the name ComfyUI's 2.1 template downloads: said what it is
        assert "ComfyUI's Qwen-Image 2.1 file (int8 ConvRot)" in printed


def test_the_demo_trains_21_from_comfyuis_single_files(files21, tmp_path, capsys):
    """`demo --model qwen-image-2.1` from ComfyUI's files: the transformer, the Qwen3-VL text encoder file and the
    2.1 VAE file, with the 2.1 folder for the processor (issue 45: refused, 'its text encoder and VAE single-file
    layouts are not read here', though the loaders read them). Without the folder, refused naming --diffusers-folder."""
    from trainer_core.runs.cli import main

    files = ["--transformer", str(files21["transformer_fp8_e4m3fn_scaled"]), "--text-encoder",
             str(files21["text_encoder"]), "--vae", str(files21["vae"])]
    assert main(["demo", "--model", FAMILY, *files, "--steps", "1", "--out", str(tmp_path / "no_folder")]) == 2
    assert "Set diffusers_folder to that folder" in capsys.readouterr().err
    assert not (tmp_path / "no_folder").exists()
    assert main(["demo", "--model", FAMILY, *files, "--diffusers-folder", str(files21["diffusers_folder"]),
                 "--steps", "1", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert f"model: qwen_image21_tiny_fp8_e4m3fn_scaled from {files21['transformer_fp8_e4m3fn_scaled']}" in printed
    assert "(qwen-image-2.1)" in printed and (tmp_path / "out" / "demo_qwen_image21_lora.safetensors").is_file()
    from PIL import Image

    with Image.open(tmp_path / "out" / "preview.png") as preview:  # the RGBA VAE's alpha kept in the PNG on disk
        assert preview.mode == "RGBA"
