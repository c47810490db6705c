"""The text encoders and the Edit-2511 transformer from ComfyUI's quantised files: Qwen2.5-VL (Qwen-Image, Edit) and
Qwen3-VL (Qwen-Image 2.1, `qwen3vl_8b_int8_convrot`) in int8 ConvRot written by comfy-kitchen (int8_files.py), kept
in one byte or dequantised; Edit-2511's `fp8mixed` file in its layout (ComfyUI's per-layer float8 entries beside bf16
layers)."""

import json

import pytest
import torch

from int8_files import int8_copy, kitchen_dequantized

pytest.importorskip("comfy_kitchen")


def _weights_as_stored(model) -> dict[str, torch.Tensor]:
    """name -> the weight the model computes with, float32 (one-byte Linears dequantised, rotations undone)."""
    from trainer_core.models.float8 import dequantized_state_dict

    return dequantized_state_dict(model)


def _check_against_kitchen(model, file_path, comfy_to_ours, kept: bool):
    from safetensors.torch import load_file

    want = kitchen_dequantized(load_file(str(file_path)))
    got = _weights_as_stored(model)
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    checked = 0
    for key, weight in want.items():
        ours = comfy_to_ours(key)
        if ours is None:  # lm_head: not loaded
            continue
        assert torch.equal(got[ours], weight), ours
        module = model.get_submodule(ours.removesuffix(".weight"))
        one_byte = module.weight.dtype == torch.int8
        assert one_byte == (kept and ours.removesuffix(".weight") in linears), ours
        checked += 1
    assert checked > 10


@pytest.mark.parametrize("fp8", ["keep", "dequantize"])
def test_qwen25_vl_int8_convrot_reads_back_as_comfy_kitchen_dequantises_it(tiny_files, tmp_path, fp8):
    from trainer_core.models.text_encoder_file import TextEncoderFile, our_name

    path = int8_copy(tiny_files["text_encoder_bf16"], tmp_path / "qwen_2.5_vl_tiny_int8_convrot.safetensors",
                     lambda k: True)
    model = TextEncoderFile(path, torch.float32, fp8, vision=True)()
    _check_against_kitchen(model, path, lambda k: our_name(k, vision=True), kept=fp8 == "keep")
    assert model.model.language_model.embed_tokens.weight.dtype == torch.float32  # a table: dequantised either way


@pytest.fixture(scope="module")
def files21(tmp_path_factory):
    from trainer_core.families import get_family

    return get_family("qwen-image-2.1").export_tiny(tmp_path_factory.mktemp("tiny21"), layout="comfyui")


@pytest.mark.parametrize("fp8", ["keep", "dequantize"])
def test_qwen3_vl_int8_convrot_reads_back_as_comfy_kitchen_dequantises_it(files21, tmp_path, fp8):
    from trainer_core.families.qwen_image21.text_file import load_qwen3_vl_file, our_name

    path = int8_copy(files21["text_encoder"], tmp_path / "qwen3vl_tiny_int8_convrot.safetensors", lambda k: True)
    model = load_qwen3_vl_file(path, torch.float32, fp8)
    _check_against_kitchen(model, path, our_name, kept=fp8 == "keep")


def test_a_kept_int8_text_encoder_encodes_what_the_dequantised_one_does(files21, tmp_path):
    """The same prompt through Qwen3-VL with its int8 Linears kept (rotated activations) and dequantised at load: the
    same hidden states to float32 rounding (the cache keys still tell the two apart: the bits may differ)."""
    from trainer_core.families.qwen_image21.text_file import load_qwen3_vl_file

    path = int8_copy(files21["text_encoder"], tmp_path / "qwen3vl_tiny_int8_convrot.safetensors", lambda k: True)
    ids = torch.tensor([[1, 7, 9, 11, 3]])
    with torch.no_grad():
        kept, dequantized = (load_qwen3_vl_file(path, torch.float32, fp8)(input_ids=ids, output_hidden_states=True)
                             .hidden_states[-1] for fp8 in ("keep", "dequantize"))
    torch.testing.assert_close(kept, dequantized, rtol=1e-5, atol=1e-5)


def test_a_fused_21_int8_file_splits_each_rows_scale_with_its_rows(files21, tmp_path):
    """ComfyUI's fused `img_mlp.gate_up` in int8: one scale per row, so the gate's rows take the first half of the
    scales; the two halves read back as comfy-kitchen dequantises the fused weight, cut in two."""
    from safetensors.torch import load_file

    from trainer_core.families.qwen_image21.files import QwenImage21TransformerFile
    from trainer_core.models.float8 import dequantized_weight

    path = int8_copy(files21["transformer_bf16"], tmp_path / "qwen_image_2.1_tiny_int8_convrot.safetensors",
                     lambda k: ".transformer_blocks." in k)
    want = kitchen_dequantized(load_file(str(path)))
    model = QwenImage21TransformerFile(path, storage="float8", compute_dtype=torch.float32).load()
    fused = "model.diffusion_model.transformer_blocks.0.img_mlp.gate_up.weight"
    gate, up = want[fused].chunk(2)
    mlp = model.transformer_blocks[0].img_mlp
    assert mlp.gate_layer.weight.dtype == torch.int8 and mlp.gate_layer.weight_scale.shape == (gate.shape[0], 1)
    assert torch.equal(dequantized_weight(mlp.gate_layer, torch.float32), gate)
    assert torch.equal(dequantized_weight(mlp.proj, torch.float32), up)


def fp8mixed(tensors: dict[str, torch.Tensor], quantised) -> dict[str, torch.Tensor]:
    """An Edit-2511 `fp8mixed` file's layout (ComfyUI 0.33's quantised layers, what its ModelSave writes): the
    layers `quantised` picks as float8 with a per-tensor `weight_scale` and a `comfy_quant` {"format":
    "float8_e4m3fn"} entry, every other tensor bf16 as it was (the Edit-2511 marker kept)."""
    from trainer_core.models.float8 import quantize_per_tensor

    out = {}
    for key, value in tensors.items():
        if key.endswith(".weight") and value.dim() == 2 and quantised(key):
            layer = key[: -len("weight")]
            out[key], out[f"{layer}weight_scale"] = quantize_per_tensor(value)
            out[f"{layer}comfy_quant"] = torch.tensor(list(json.dumps({"format": "float8_e4m3fn"}).encode()),
                                                      dtype=torch.uint8)
        else:
            out[key] = value
    return out


@pytest.mark.parametrize("fmt", ["fp8mixed", "int8_convrot"])
def test_edit_2511s_quantised_files_load_as_2511_with_their_blocks_in_one_byte(tmp_path, fmt):
    from safetensors.torch import load_file, save_file

    from trainer_core.families import get_family
    from trainer_core.families.qwen_image_edit.files import load_edit_single_files
    from trainer_core.models.float8 import FLOAT8, frozen_block_linears

    files = get_family("edit-2511").export_tiny(tmp_path / "tiny")
    source = files["transformer_bf16"]
    target = tmp_path / f"qwen_image_edit_2511_{fmt}.safetensors"
    blocks = lambda k: k.startswith("transformer_blocks.")  # noqa: E731  (the tiny export's keys are bare)
    if fmt == "fp8mixed":
        save_file(fp8mixed(load_file(str(source)), blocks), str(target))
        target.with_suffix(".json").write_text(source.with_suffix(".json").read_text())
    else:
        int8_copy(source, target, blocks)
    text_encoder = int8_copy(files["text_encoder_bf16"], tmp_path / "qwen_2.5_vl_int8_convrot.safetensors",
                             lambda k: True)
    components = load_edit_single_files(target, text_encoder, files["vae"], files["tokenizer"],
                                        storage="float8", compute_dtype=torch.float32, text_encoder_fp8="keep")
    assert components.family.variant.name == "edit-2511"
    model = components.ensure_transformer()
    want = torch.int8 if fmt == "int8_convrot" else FLOAT8
    linears = [lin for _, lin in frozen_block_linears(model)]
    assert all(lin.weight.dtype == want for lin in linears)
    if fmt == "fp8mixed":  # the file's float8 with its per-tensor scale, not our float8 of bf16 weights
        assert all(lin.weight_scale.numel() == 1 for lin in linears)
    else:
        assert all(lin.weight_scale.shape == (lin.out_features, 1) for lin in linears)
        assert any(getattr(lin, "int8_rotation_group", 0) == 16 for lin in linears)
