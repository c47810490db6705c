"""Edit model files: the tiny exporter in ComfyUI's layout and diffusers', the variant read from the file (and
chosen), the text encoder's vision tower, and the edit demo from the command line."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

from trainer_core.families import get_family
from trainer_core.families.qwen_image_edit.tiny import build_tiny_edit_components
from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image_edit.files import load_edit_diffusers_dir, load_edit_single_files


@pytest.fixture(scope="module")
def files_2511(tmp_path_factory):
    return get_family("edit-2511").export_tiny(tmp_path_factory.mktemp("edit_2511"))


def test_2511_file_carries_comfyuis_marker_and_loads_as_2511_with_its_vision_tower(files_2511):
    with safe_open(str(files_2511["transformer_bf16"]), "pt") as f:
        assert "__index_timestep_zero__" in f.keys()
    components = load_edit_single_files(files_2511["transformer_fp8_e4m3fn_scaled"], files_2511["text_encoder_bf16"],
                                        files_2511["vae"], storage="float32", compute_dtype=torch.float32)
    assert components.family.variant.name == "edit-2511" and components.ensure_transformer().config.zero_cond_t
    components.ensure_text_encoder()
    reference = build_tiny_edit_components("edit-2511")
    ours = dict(components.text_encoder.model.visual.named_parameters())
    theirs = dict(reference.text_encoder.model.visual.named_parameters())
    assert ours.keys() == theirs.keys() and len(ours) > 10
    for name, value in theirs.items():  # the file holds bf16: the same weights, rounded
        assert torch.equal(ours[name], value.to(torch.bfloat16).float()), name


def test_variant_is_read_from_names_and_folders_and_a_wrong_choice_is_refused(files_2511, tmp_path):
    with pytest.raises(UserInputError, match="edit-2509.*was chosen, but the transformer is 'edit-2511'"):
        load_edit_single_files(files_2511["transformer_bf16"], files_2511["text_encoder_bf16"], files_2511["vae"],
                               storage="float32", compute_dtype=torch.float32, variant="edit-2509")
    plus = get_family("edit-2509").export_tiny(tmp_path / "2509")
    loaded = load_edit_single_files(plus["transformer_bf16"], plus["text_encoder_bf16"], plus["vae"],
                                    storage="float32", compute_dtype=torch.float32)
    assert loaded.family.variant.name == "edit-2509" and not loaded.skeleton().config.zero_cond_t
    folder = get_family("edit-2511").export_tiny(tmp_path / "dir", layout="diffusers")["diffusers_folder"]
    loaded = load_edit_diffusers_dir(folder, storage="float32", compute_dtype=torch.float32)
    assert loaded.family.variant.name == "edit-2511" and loaded.transformer.config.zero_cond_t


@pytest.mark.slow
def test_edit_demo_trains_from_exported_files_and_writes_a_comfyui_lora_preview_and_plot(files_2511, tmp_path, capsys):
    from trainer_core.runs.cli import main

    files = ["--transformer", str(files_2511["transformer_fp8_e4m3fn_scaled"]),
             "--text-encoder", str(files_2511["text_encoder_fp8_scaled"]), "--vae", str(files_2511["vae"])]
    assert main(["demo", "--model", "edit-auto", *files, "--steps", "6", "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    stdout = capsys.readouterr().out
    assert "(edit-2511)" in stdout and "loss: first step" in stdout
    keys = load_file(str(out / "edit_lora.safetensors"))
    assert len(keys) == 3 * (2 * 14 - 4) and all(k.startswith("diffusion_model.transformer_blocks.") for k in keys)
    assert Image.open(out / "preview.png").size == (256, 256) and Image.open(out / "loss.png").size == (768, 384)


@pytest.mark.slow
def test_edit_lora_loads_in_diffusers_edit_pipeline_on_every_module(files_2511, tmp_path):
    """diffusers' own loader (`QwenImageEditPlusPipeline.load_lora_weights`) takes our edit LoRA: every module
    of the file gets its adapter, with the file's weights."""
    from diffusers import QwenImageEditPlusPipeline

    from trainer_core.runs.cli import main

    files = ["--transformer", str(files_2511["transformer_bf16"]), "--text-encoder", str(files_2511["text_encoder_bf16"]),
             "--vae", str(files_2511["vae"])]
    assert main(["demo", "--model", "edit-2511", *files, "--steps", "3", "--out", str(tmp_path / "out")]) == 0
    lora = load_file(str(tmp_path / "out" / "edit_lora.safetensors"))
    components = build_tiny_edit_components("edit-2511")
    pipe = QwenImageEditPlusPipeline(scheduler=None, vae=components.vae, text_encoder=None, tokenizer=None,
                                     processor=None, transformer=components.transformer)
    pipe.load_lora_weights(str(tmp_path / "out" / "edit_lora.safetensors"))
    modules = {k[len("diffusion_model."):-len(".alpha")] for k in lora if k.endswith(".alpha")}
    loaded = {name for name, m in pipe.transformer.named_modules() if hasattr(m, "lora_A") and len(m.lora_A)}
    assert loaded == modules
    for name in modules:
        m = pipe.transformer.get_submodule(name)
        adapter = next(iter(m.lora_B))
        assert torch.equal(m.lora_B[adapter].weight.float(), lora[f"diffusion_model.{name}.lora_B.weight"].float())
