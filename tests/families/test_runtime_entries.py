"""ComfyUI's runtime entries (issue 53): `<module>.comfy_attention.config` in a model file and `<module>.config` in a
LoRA are uint8 JSON preferences for how ComfyUI runs a module (an attention backend), not weights. A 2.1 int8 ConvRot
transformer (comfy-kitchen's, int8_files.py) with such an entry in every block trains and saves, its status naming
what the file asks for once; a LoRA carrying such entries continues, and our saves leave them out, so ComfyUI's key
map (tests/host) meets no leftover key."""

import json
import tomllib

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import REPO
from int8_files import comfy_quant, int8_copy

pytest.importorskip("comfy_kitchen")
RUN_FILE = REPO / "run_files" / "qwen_image21.toml"
PREFIX = "model.diffusion_model."


def _with_attention_entries(path, choice="comfy_kitchen_int8"):
    """The file at `path` with `transformer_blocks.N.attn.comfy_attention.config` in every block, as ComfyUI
    documents (the attention preference of 2.1's blocks); returns the block count."""
    tensors = load_file(str(path))
    blocks = sorted({int(k[len(PREFIX):].split(".")[1]) for k in tensors if k.startswith(PREFIX + "transformer_blocks.")})
    for n in blocks:
        tensors[f"{PREFIX}transformer_blocks.{n}.attn.comfy_attention.config"] = comfy_quant({"attention": choice})
    save_file(tensors, str(path))
    return len(blocks)


def _run(files21, demo_folder, tmp_path, transformer, name, capsys, continue_from=""):
    from trainer_core.runs.cli import main
    from trainer_core.runs.run_file_toml import render

    data = tomllib.loads(RUN_FILE.read_text())
    data["model"].update(transformer=str(transformer), diffusers_folder=str(files21["diffusers_folder"]),
                         compute_dtype="float32")
    data["dataset"][0].update(folder=str(demo_folder), resolution=64, min_bucket_side=32, max_bucket_side=128)
    data["train"].update(blocks_to_swap=0, run_name=name)
    data["previews"].update(preview_every=0, preview_size=64)
    if continue_from:
        data.setdefault("lora", {})["continue_from_lora"] = str(continue_from)
    path = tmp_path / f"{name}.toml"
    path.write_text(render(data))
    assert main(["train", "--config", str(path), "--output", str(tmp_path / "out"), "--steps", "2"]) == 0
    return capsys.readouterr().out, sorted((tmp_path / "out" / name).glob(f"{name}_*.safetensors"))[-1]


@pytest.fixture(scope="module")
def files21(tmp_path_factory):
    from trainer_core.families import get_family

    return get_family("qwen-image-2.1").export_tiny(tmp_path_factory.mktemp("tiny21"), layout="comfyui")


def test_an_int8_21_file_with_attention_entries_in_every_block_trains_saves_and_a_lora_with_config_continues(
        files21, demo_folder, tmp_path, capsys):
    from trainer_core.families.qwen_image21.files import QwenImage21TransformerFile

    transformer = int8_copy(files21["transformer_bf16"], tmp_path / "qwen_image_2.1_int8_convrot.safetensors",
                            lambda k: ".transformer_blocks." in k, group=16)
    blocks = _with_attention_entries(transformer)
    source = QwenImage21TransformerFile(transformer, storage="float8", compute_dtype=torch.float32)
    assert not any("comfy_attention" in n for n in source.names)  # left out of the model
    note = (f"transformer file {transformer.name} asks ComfyUI for comfy_kitchen_int8 attention in {blocks} blocks; "
            "training uses standard attention")
    assert source.runtime_note.startswith(note)

    printed, lora = _run(files21, demo_folder, tmp_path, transformer, "with_entries", capsys)
    assert printed.count(note) == 1, printed  # named once in the run's status
    saved = load_file(str(lora))
    assert saved and not any(k.endswith(".config") for k in saved)

    # A LoRA that carries ComfyUI's `.config` entries (a turbo LoRA's attention) continues: named, not carried.
    entries = {f"diffusion_model.transformer_blocks.{n}.attn.config": comfy_quant({"attention": "comfy_kitchen_sol",
                                                                                  "tau": 0.5}) for n in range(blocks)}
    turbo = tmp_path / "turbo_lora.safetensors"
    save_file({**saved, **entries}, str(turbo))
    printed, continued = _run(files21, demo_folder, tmp_path, transformer, "continued", capsys, continue_from=turbo)
    assert f"LoRA file {turbo.name} carries {blocks} ComfyUI runtime entries" in printed, printed
    again = load_file(str(continued))
    assert set(again) == set(saved)  # the same LoRA keys; the entries not carried into our save


def test_a_lora_with_config_entries_reads_as_the_same_lora(tmp_path, trained_lora):
    from trainer_core.adapters.lora_reading import read_lora_file

    plain = tmp_path / "plain.safetensors"
    trained_lora.save_lora(plain, torch.float32)
    tensors = load_file(str(plain))
    key = "diffusion_model.transformer_blocks.0.attn.config"
    save_file({**tensors, key: comfy_quant({"attention": "comfy_kitchen_int8"})}, str(tmp_path / "with.safetensors"))
    a, b = read_lora_file(plain), read_lora_file(tmp_path / "with.safetensors")
    assert b.runtime_entries == (key,) and a.runtime_entries == ()
    assert (a.rank, a.alpha, a.weights.keys()) == (b.rank, b.alpha, b.weights.keys())
    assert all(torch.equal(a.weights[m][i], b.weights[m][i]) for m in a.weights for i in (0, 1))
    assert json.loads(bytes(load_file(str(tmp_path / "with.safetensors"))[key].tolist()))["attention"]
