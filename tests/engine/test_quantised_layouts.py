"""Every layout ComfyUI documents (comfy/quant_ops.py, QUANTIZATION.md) is read or refused by name (issue 53): the
layers here are written by comfy-kitchen's own quantiser (int8_files.py `kitchen_layer`). float8_e4m3fn, float8_e5m2
and int8_tensorwise (ConvRot or not: test_int8_files.py) are read; nvfp4, mxfp8, convrot_w4a4, asym_w4a8_int8 and
awq_w4a16 are refused naming the file, the layer, its format and the files of the same model to choose instead."""

import pytest
import torch

from int8_files import KITCHEN_LAYOUTS, comfy_quant, kitchen_layer
from trainer_core.core.errors import UserInputError

pytest.importorskip("comfy_kitchen")

REFUSED = ("nvfp4", "mxfp8", "convrot_w4a4", "asym_w4a8_int8", "awq_w4a16")
# comfy-kitchen's w4a4 quantiser takes 64 input features at least, wider than the tiny Qwen3-VL's 16 and 32 (the
# transformer test below refuses it on a layer of 128)
REFUSED_TEXT = tuple(f for f in REFUSED if f != "convrot_w4a4")


@pytest.fixture(scope="module")
def files21(tmp_path_factory):
    from trainer_core.families import get_family

    return get_family("qwen-image-2.1").export_tiny(tmp_path_factory.mktemp("tiny21"), layout="comfyui")


def _quantised_copy(source, target, fmt, pick):
    """The file at `source` with every 2-D weight `pick` selects quantised as `fmt` by comfy-kitchen; the config JSON
    beside it copied."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(source))
    out = {}
    for key, tensor in tensors.items():
        if key.endswith(".weight") and tensor.dim() == 2 and pick(key):
            out.update(kitchen_layer(key, tensor, fmt))
        else:
            out[key] = tensor
    save_file(out, str(target))
    sidecar = source.with_suffix(".json")
    if sidecar.is_file():
        target.with_suffix(".json").write_text(sidecar.read_text())
    return sorted(k[: -len(".comfy_quant")] for k in out if k.endswith(".comfy_quant"))


@pytest.mark.parametrize("fmt", REFUSED_TEXT)
def test_the_21_text_encoder_in_a_layout_not_read_here_is_refused_naming_the_layer_and_the_files_to_choose(
        files21, tmp_path, fmt):
    """Comfy-Org's 2.1 text encoder ships as qwen3vl_8b_w4a8 beside the int8 ConvRot and bf16 files: a Qwen3-VL file
    in any 4-bit or block-scaled layout is refused before a weight is read, naming those two."""
    from trainer_core.families.qwen_image21.text_file import load_qwen3_vl_file

    target = tmp_path / "qwen3vl_8b_w4a8.safetensors"
    layers = _quantised_copy(files21["text_encoder"], target, fmt, lambda k: ".mlp.down_proj." in k)
    assert layers
    with pytest.raises(UserInputError) as e:
        load_qwen3_vl_file(target, torch.float32, "keep")
    message = str(e.value)
    assert str(target) in message and f"layer {layers[0]}, format {fmt!r}" in message, message
    assert "Choose qwen3vl_8b_int8_convrot.safetensors or qwen3vl_8b_bf16.safetensors." in message


@pytest.mark.parametrize("fmt", REFUSED)
def test_a_transformer_in_a_layout_not_read_here_is_refused_naming_the_layer_and_the_files_to_choose(
        tiny_files, tmp_path, fmt):
    from trainer_core.models.transformer_file import TransformerFile

    target = tmp_path / f"qwen_image_{fmt}.safetensors"
    # img_mlp.net.2: 128 input features, which every layout's groups divide
    layers = _quantised_copy(tiny_files["transformer_bf16"], target, fmt, lambda k: "img_mlp.net.2" in k)
    with pytest.raises(UserInputError) as e:
        TransformerFile(target)
    message = str(e.value)
    assert str(target) in message and f"layer {layers[0]}, format {fmt!r}" in message, message
    assert "qwen_image_int8_convrot.safetensors or qwen_image_fp8_e4m3fn.safetensors or qwen_image_bf16" in message


def test_float8_layers_in_comfyuis_layout_read_as_comfy_kitchen_dequantises_them(tiny_files, tmp_path):
    """float8_e4m3fn from comfy-kitchen's quantiser (a per-tensor scale) reads as its own dequantisation, and a
    float8_e5m2 layer (ComfyUI's other per-tensor float8: comfy-kitchen 0.2.36 has no quantiser for it) as weight times
    scale."""
    from comfy_kitchen.tensor import QuantizedTensor
    from comfy_kitchen.tensor.fp8 import TensorCoreFP8Layout
    from safetensors.torch import load_file, save_file

    from trainer_core.models.float8 import dequantized_state_dict
    from trainer_core.models.transformer_file import TransformerFile

    target = tmp_path / "qwen_image_fp8mixed.safetensors"
    layers = _quantised_copy(tiny_files["transformer_bf16"], target, "float8_e4m3fn", lambda k: ".attn.to_q." in k)
    tensors = load_file(str(target))
    e5m2 = "transformer_blocks.0.attn.to_k"
    weight = tensors[f"{e5m2}.weight"].float()
    scale = weight.abs().amax() / 57344.0
    tensors[f"{e5m2}.weight"] = (weight / scale).to(torch.float8_e5m2)
    tensors[f"{e5m2}.weight_scale"] = scale.reshape(())
    tensors[f"{e5m2}.comfy_quant"] = comfy_quant({"format": "float8_e5m2"})
    save_file(tensors, str(target))
    got = dequantized_state_dict(TransformerFile(target, storage="float32", compute_dtype=torch.float32).load())
    for layer in layers:
        params = TensorCoreFP8Layout.Params(scale=tensors[f"{layer}.weight_scale"], orig_dtype=torch.float32,
                                            orig_shape=tuple(tensors[f"{layer}.weight"].shape))
        want = QuantizedTensor(tensors[f"{layer}.weight"], "TensorCoreFP8Layout", params).dequantize()
        assert torch.equal(got[f"{layer}.weight"], want), layer
    assert torch.equal(got[f"{e5m2}.weight"], tensors[f"{e5m2}.weight"].float() * scale)


def test_every_documented_format_has_a_writer_here():
    assert set(KITCHEN_LAYOUTS) | {"float8_e5m2", "int8_tensorwise"} == {
        "float8_e4m3fn", "float8_e5m2", "int8_tensorwise", "nvfp4", "mxfp8", "convrot_w4a4", "asym_w4a8_int8",
        "awq_w4a16"}
