"""Training end to end from ComfyUI's int8 ConvRot files (written by comfy-kitchen, int8_files.py), headless and
through the canvas engine's calls: Qwen-Image 2.1 editing and Qwen-Image-Edit-2511, their transformers' blocks and
their text encoders' Linears kept in int8 (`text_encoder_fp8 = "keep"`). Each run caches, trains, previews at step
0 and saves; the canvas's calls give the headless LoRA bit for bit, from the same cache entries. (2.1 text-to-image:
tests/families/test_qwen_image21_canvas.py, its shipped workflow and run file on the same files.)"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from conftest import REPO
from int8_files import int8_copy

pytest.importorskip("comfy_kitchen")
CPU = torch.device("cpu")


def same_tensors(a: Path, b: Path) -> bool:
    ta, tb = load_file(str(a)), load_file(str(b))
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def one_byte_everywhere(components) -> None:
    """The transformer's block Linears and the text encoder's decoder Linears are int8, as the files store them."""
    from trainer_core.models.float8 import frozen_block_linears

    blocks = {lin.weight.dtype for _, lin in frozen_block_linears(components.transformer)}
    encoder, _ = components.text_encoder_loader()
    decoder = {m.weight.dtype for n, m in encoder.named_modules()
               if isinstance(m, torch.nn.Linear) and ".layers." in n}
    assert blocks == {torch.int8} and decoder == {torch.int8}, (blocks, decoder)


def canvas_lora(components, dataset, run, cache: Path, target: Path) -> Path:
    """The canvas engine's calls after the Load node: the Cache node's build (which must find every entry the headless
    run cached), Init Trainer, Train Steps, a Preview and Save."""
    from trainer_core.data.cache import build_cache
    from trainer_core.training import Trainer

    cached = build_cache(components, list(dataset.samples), cache, preview_prompts=run.preview_prompts,
                         settings=components.family.data_settings(dataset))
    assert cached.report.latents_encoded == 0 and cached.report.prompts_encoded == 0, cached.report.summary()
    trainer = Trainer(components, cached, run.lora, run.optimizer, run.train)
    try:
        trainer.train(2)
        one_byte_everywhere(components)
        image = trainer.sample_preview(run.preview_prompts[0], cached.negative_prompt, 64, 64, 2, 4.0, 0)
        assert image.size == (64, 64)
        trainer.save_lora(target, getattr(torch, run.save.dtype), layout=run.save.layout)
    finally:
        trainer.close()
    return target


@pytest.mark.slow
def test_21_editing_trains_from_comfyuis_int8_files_headless_and_on_the_canvas(tmp_path, capsys):
    from test_headless_edit import edit21_run_file

    from trainer_core.core.config import DatasetConfig
    from trainer_core.families import get_family
    from trainer_core.data.edit_dataset import load_edit_dataset
    from trainer_core.families.loading import LoadRequest, load_model_set
    from trainer_core.runs.cli import main
    from trainer_core.runs.run_file import read_run_file
    from trainer_core.runs.run_file_toml import render

    files21 = get_family("qwen-image-2.1").export_tiny(tmp_path / "tiny21", layout="comfyui")
    transformer = int8_copy(files21["transformer_bf16"], tmp_path / "qwen_image_2.1_int8_convrot.safetensors",
                            lambda k: ".transformer_blocks." in k)
    encoder = int8_copy(files21["text_encoder"], tmp_path / "qwen3vl_8b_int8_convrot.safetensors", lambda k: True)
    path = edit21_run_file(tmp_path, files21)
    data = tomllib.loads(path.read_text())
    data["model"].update(transformer=str(transformer), text_encoder=str(encoder), text_encoder_fp8="keep")
    data["previews"].update(preview_every=2, preview_sampling_steps=2)
    path.write_text(render(data))
    out = tmp_path / "out"
    assert main(["train", "--config", str(path), "--output", str(out), "--steps", "2"]) == 0
    assert "model: qwen_image_2.1_int8_convrot (2 blocks, int8 ConvRot (the file's) blocks" in capsys.readouterr().out
    run_dir = out / "qwen_image21_edit_lora"
    assert Image.open(run_dir / "previews" / "step_000000_0.png").size == (64, 64)
    headless = run_dir / "qwen_image21_edit_lora_000002.safetensors"

    run, _ = read_run_file(path)
    components = load_model_set(LoadRequest(run.load.source, CPU, storage=run.load.storage, compute_dtype=run.load.compute_dtype,
                                 transformer=run.load.transformer, text_encoder=run.load.text_encoder,
                                 diffusers_folder=run.load.diffusers_folder, text_encoder_fp8="keep"))
    cfg = run.datasets[0]
    dataset = load_edit_dataset(DatasetConfig(**{f: getattr(cfg, f) for f in ("folder", "resolution", "min_bucket_side",
                                                                              "max_bucket_side")}), run.edit.data)
    assert same_tensors(headless, canvas_lora(components, dataset, run, out / "cache", tmp_path / "canvas.safetensors"))


@pytest.mark.slow
def test_edit_2511_trains_from_comfyuis_int8_files_headless_and_on_the_canvas(tmp_path, capsys):
    from trainer_core.core.config import DatasetConfig
    from trainer_core.families import get_family
    from trainer_core.data.edit_dataset import load_edit_dataset
    from trainer_core.families.loading import LoadRequest, load_model_set
    from trainer_core.runs.cli import main
    from trainer_core.runs.run_file import read_run_file
    from trainer_core.runs.run_file_toml import render

    files = get_family("edit-2511").export_tiny(tmp_path / "tiny")
    transformer = int8_copy(files["transformer_bf16"], tmp_path / "qwen_image_edit_2511_int8_convrot.safetensors",
                            lambda k: k.startswith("transformer_blocks."))
    encoder = int8_copy(files["text_encoder_bf16"], tmp_path / "qwen_2.5_vl_7b_int8_convrot.safetensors",
                        lambda k: True)
    shutil.copytree(files["tokenizer"], tmp_path / "tokenizer")  # beside the text encoder: found there
    folder = tmp_path / "edit_shapes"
    folder.mkdir()
    for sample in (REPO / "example_dataset" / "edit_shapes").glob("00_*"):
        shutil.copy(sample, folder / sample.name)
    data = tomllib.loads((REPO / "run_files" / "tiny_edit.toml").read_text())
    data["model"] = dict(source="files", transformer=str(transformer), text_encoder=str(encoder),
                         vae=str(files["vae"]), storage="float8", compute_dtype="float32", text_encoder_fp8="keep")
    data["edit"]["variant"] = "auto"  # read from the file: ComfyUI's 2511 marker survives the int8 writer
    data["dataset"][0]["folder"] = str(folder)
    data["previews"].update(preview_every=2, preview_sampling_steps=2)
    path = tmp_path / "edit_int8.toml"
    path.write_text(render(data))
    out = tmp_path / "out"
    assert main(["train", "--config", str(path), "--output", str(out), "--steps", "2"]) == 0
    printed = capsys.readouterr().out
    assert "model: qwen_image_edit_2511_int8_convrot (2 blocks, int8 ConvRot (the file's) blocks" in printed, printed
    run_dir = out / "tiny_edit"
    assert Image.open(run_dir / "previews" / "step_000000_0.png").size == (64, 64)
    headless = run_dir / "tiny_edit_000002.safetensors"

    run, _ = read_run_file(path)
    components = load_model_set(LoadRequest(run.load.source, CPU, storage=run.load.storage,
                                            compute_dtype=run.load.compute_dtype, transformer=run.load.transformer,
                                            text_encoder=run.load.text_encoder, vae=run.load.vae,
                                            text_encoder_fp8="keep", edit=True))
    assert components.family.variant.name == "edit-2511"
    cfg = run.datasets[0]
    dataset = load_edit_dataset(DatasetConfig(**{f: getattr(cfg, f) for f in ("folder", "resolution", "min_bucket_side",
                                                                              "max_bucket_side")}), run.edit.data)
    assert same_tensors(headless, canvas_lora(components, dataset, run, out / "cache", tmp_path / "canvas.safetensors"))
