"""ComfyUI's int8 ConvRot files (the files its Qwen-Image 2.1 and Edit-2511 templates download), read and computed
with, against comfy-kitchen (ComfyUI's own quantisation library): every file here is written by comfy-kitchen's
quantiser in ComfyUI's layout (int8_files.py), and every number is checked against comfy-kitchen's own functions.
"""

import json

import pytest
import torch
import torch.nn.functional as F

from int8_files import comfy_quant, int8_copy, kitchen_dequantized, kitchen_quantize, to_int8
from trainer_core.core.errors import UserInputError
from trainer_core.models import int8_convrot

pytest.importorskip("comfy_kitchen")


def test_the_rotation_quantisation_and_dequantisation_are_comfy_kitchens_bit_for_bit():
    from comfy_kitchen.backends.eager import quantization as eager
    from comfy_kitchen.tensor.int8_utils import _build_hadamard, _rotate_activation

    for group in (4, 16, 64, 256, 1024):
        for dtype in (torch.float32, torch.bfloat16):
            assert torch.equal(int8_convrot.hadamard(group, dtype), _build_hadamard(group, dtype=dtype))
    torch.manual_seed(0)
    weight = torch.randn(96, 512) * 0.02
    for group in (256, 16):
        q, scale = int8_convrot.quantize(weight, group)
        want_q, want_scale = eager.quantize_int8_convrot_weight(weight, group)
        assert torch.equal(q, want_q) and torch.equal(scale, want_scale)
        assert torch.equal(int8_convrot.dequantize(q, scale, group), eager.dequantize_int8_convrot_weight(q, scale, group))
    q, scale = int8_convrot.quantize(weight, 0)  # plain per-row int8: the layers a group does not divide
    want_q, want_scale = eager.quantize_int8_rowwise(weight)
    assert torch.equal(q, want_q) and torch.equal(scale, want_scale)
    x = torch.randn(3, 7, 512, dtype=torch.bfloat16)
    assert torch.equal(int8_convrot.rotate(x, 256), _rotate_activation(x, _build_hadamard(256, dtype=torch.bfloat16), 256))


@pytest.mark.parametrize("spelling", ["top level", "nested params"])
def test_a_layers_rotation_is_read_from_either_spelling(spelling):
    top = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 64}
    nested = {"format": "int8_tensorwise", "params": {"convrot": True, "convrot_groupsize": 64}}
    assert int8_convrot.rotation_group(top if spelling == "top level" else nested) == 64
    assert int8_convrot.rotation_group({"format": "int8_tensorwise"}) == 0
    with pytest.raises(ValueError, match="not a power of 4"):
        int8_convrot.rotation_group({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 128})


def frozen_int8_linear(weight: torch.Tensor, bias: torch.Tensor, group: int) -> torch.nn.Linear:
    """A Linear holding comfy-kitchen's int8 of `weight` the way the loaders store it (models/streaming.py)."""
    from trainer_core.models.streaming import assign_frozen_linear_weight

    qt, rotated = kitchen_quantize(weight, group)
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0])
    linear.bias = torch.nn.Parameter(bias.clone(), requires_grad=False)
    state = qt.state_dict("weight")
    assign_frozen_linear_weight(linear, state["weight"], state["weight_scale"], group if rotated else 0)
    return linear


@pytest.mark.parametrize("group", [256, 0])
def test_an_int8_linear_multiplies_by_the_weight_comfy_kitchen_dequantises_in_both_passes(group):
    torch.manual_seed(0)
    weight, bias = torch.randn(64, 512) * 0.05, torch.randn(64)
    linear = frozen_int8_linear(weight, bias, group)
    assert linear.weight.dtype == torch.int8 and linear.weight_scale.shape == (64, 1)
    qt, _ = kitchen_quantize(weight, group)
    dequantized = qt.dequantize()  # comfy-kitchen's W = (q * scale) H
    x = torch.randn(2, 5, 512, requires_grad=True)
    y = linear(x)
    want_x = x.detach().clone().requires_grad_(True)
    want = F.linear(want_x, dequantized, bias)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)  # fp32: only the order of the sums differs
    grad = torch.randn_like(y)
    y.backward(grad)
    want.backward(grad)
    torch.testing.assert_close(x.grad, want_x.grad, rtol=1e-5, atol=1e-5)


def _block21(dtype: torch.dtype, width: int = 512):
    """A one-block Qwen-Image 2.1 at head size 128 (4 heads): every Linear's input features a multiple of 256, the
    real ConvRot group. Its weights hold bf16 values (what the file is made from), its parameters are in `dtype` and
    its buffers stay float32, as the loaders build a model (the timestep's frequencies rounded to bf16 would change
    the output by more than int8 does)."""
    from diffusers import QwenImage21Transformer2DModel

    torch.manual_seed(0)
    model = QwenImage21Transformer2DModel(num_layers=1, num_attention_heads=width // 128, attention_head_dim=128,
                                          context_in_dim=64, in_channels=16, out_channels=16,
                                          axes_dims_rope=(16, 56, 56)).eval()
    for param in model.parameters():
        param.data = param.data.bfloat16().to(dtype)
    return model


def _forward21(model, dtype: torch.dtype, seed: int = 1):
    from trainer_core.families.qwen_image21.objective import transformer_kwargs

    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(1, 64, 16, generator=g).to(dtype)  # an 8 x 8 latent grid
    text = torch.randn(1, 12, 64, generator=g).to(dtype)
    with torch.no_grad():
        return model(timestep=torch.tensor([0.4]), **transformer_kwargs(hidden, (8, 8), text, None)).sample.float()


def _relative_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item()


# What the test below measures (2026-12-06, the CPU; it prints them with -s): relative RMS of the output, ours vs
# comfy-kitchen's dequantised weights / ComfyUI's int8 compute vs the bf16 weights. float32: 1.07e-7 / 3.04e-4;
# bfloat16: 1.71e-3 / 2.19e-3.
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 5e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_a_block_from_an_int8_convrot_file_computes_comfy_kitchens_weights_closer_than_comfyuis_own_int8(tmp_path,
                                                                                                         dtype):
    """The model read from comfy-kitchen's int8 ConvRot file (group 256, block Linears int8, as ComfyUI's 2.1 file)
    against the same model with comfy-kitchen's dequantised weights: within TOLERANCE, and closer than ComfyUI's own
    int8 compute (comfy-kitchen's `int8_linear`, which quantises the rotated activations too) is to the bf16 weights
    the file was made from. Each frozen block weight is held in one byte (plus one fp32 scale per row)."""
    from comfy_kitchen.backends.eager.quantization import int8_linear
    from safetensors.torch import save_file

    from trainer_core.families.qwen_image21.files import QwenImage21TransformerFile, comfyui_transformer_tensors
    from trainer_core.models.float8 import frozen_block_linears

    tensors = to_int8(comfyui_transformer_tensors(_block21(torch.float32), "bf16", "fused"),
                      lambda k: ".transformer_blocks." in k, group=256)
    path = tmp_path / "qwen_image_2.1_int8_convrot.safetensors"
    save_file(tensors, str(path))
    path.with_suffix(".json").write_text(json.dumps({"part": "transformer", "config": {"axes_dims_rope": [16, 56, 56]}}))
    ours = QwenImage21TransformerFile(path, storage="float8", compute_dtype=dtype).load()
    linears = dict(frozen_block_linears(ours))
    assert all(lin.weight.dtype == torch.int8 and getattr(lin, "int8_rotation_group", 0) == 256
               for lin in linears.values())
    weights = sum(lin.weight.numel() for lin in linears.values())
    stored = sum(lin.weight.numel() * lin.weight.element_size() + lin.weight_scale.numel() * 4
                 for lin in linears.values())
    assert 1.0 < stored / weights < 1.01  # one byte a weight, a 4-byte scale per row of 512 or 1536

    dequantized = _block21(dtype)  # the same model with comfy-kitchen's dequantised weights
    state = dequantized.state_dict()
    for key, weight in kitchen_dequantized(tensors).items():
        name = key.removeprefix("model.diffusion_model.")
        if ".img_mlp.gate_up." in name:  # the fused file's halves: gate rows first
            state[name.replace("gate_up", "gate_layer")], state[name.replace("gate_up", "proj")] = weight.chunk(2)
        else:
            state[name] = weight
    dequantized.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()})

    comfy_int8 = _block21(dtype)  # ComfyUI's compute: rotated activations quantised per row, int8 x int8
    for name, linear in frozen_block_linears(comfy_int8):
        linear.forward = (lambda x, lin=linears[name]: int8_linear(x, lin.weight, lin.weight_scale, lin.bias, x.dtype,
                                                                   True, 256))
    bf16_weights = _forward21(_block21(dtype), dtype)
    ours_error = _relative_rms(_forward21(ours, dtype), _forward21(dequantized, dtype))
    comfy_error = _relative_rms(_forward21(comfy_int8, dtype), bf16_weights)
    print(f"{dtype}: ours {ours_error:.2e}, ComfyUI int8 {comfy_error:.2e}")
    assert ours_error < TOLERANCE[dtype] and ours_error < comfy_error, (ours_error, comfy_error)


def test_a_tiny_transformer_file_in_int8_loads_each_layer_as_comfy_kitchen_dequantises_it(tiny_files, tmp_path):
    """Every Linear of the tiny Qwen-Image file int8 (block Linears kept in one byte, rotated where the group divides
    their input features, the layers outside the blocks dequantised to the compute dtype)."""
    from safetensors.torch import load_file

    from trainer_core.models.float8 import dequantized_state_dict, frozen_block_linears
    from trainer_core.models.transformer_file import TransformerFile

    path = int8_copy(tiny_files["transformer_bf16"], tmp_path / "qwen_image_tiny_int8_convrot.safetensors",
                     lambda k: True, group=64)
    want = kitchen_dequantized(load_file(str(path)))
    model = TransformerFile(path, storage="float8", compute_dtype=torch.float32).load()
    block = dict(frozen_block_linears(model))
    assert block and all(lin.weight.dtype == torch.int8 for lin in block.values())
    # rotated where 64 divides the input features (128), plain per-row int8 where it does not (32)
    assert {getattr(lin, "int8_rotation_group", 0) for lin in block.values()} == {64, 0}
    got = dequantized_state_dict(model)
    for key, weight in want.items():
        assert torch.equal(got[key], weight), key
    assert model.img_in.weight.dtype == torch.float32  # outside the blocks: dequantised


def test_a_bf16_storage_of_an_int8_file_dequantises_its_block_linears(tiny_files, tmp_path):
    from safetensors.torch import load_file

    from trainer_core.models.float8 import frozen_block_linears
    from trainer_core.models.transformer_file import TransformerFile

    path = int8_copy(tiny_files["transformer_bf16"], tmp_path / "t_int8.safetensors", lambda k: "blocks" in k)
    want = kitchen_dequantized(load_file(str(path)))
    model = TransformerFile(path, storage="bfloat16", compute_dtype=torch.bfloat16).load()
    for name, linear in frozen_block_linears(model):
        assert linear.weight.dtype == torch.bfloat16 and not hasattr(linear, "int8_rotation_group")
        assert torch.equal(linear.weight, want[f"{name}.weight"].bfloat16())


QUANTISED_FORMATS = {  # ComfyUI's other formats (comfy/quant_ops.py): refused by name
    "nvfp4": {"format": "nvfp4"},
    "mxfp8": {"format": "mxfp8"},
    "w4a8": {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256},
    "w4a4": {"format": "convrot_w4a4", "convrot_groupsize": 256},
}


@pytest.mark.parametrize("fmt", list(QUANTISED_FORMATS))
def test_a_format_not_read_here_is_refused_naming_the_file_the_format_and_the_files_to_choose(tiny_files, tmp_path,
                                                                                              fmt):
    from safetensors.torch import load_file, save_file

    from trainer_core.models.transformer_file import TransformerFile

    tensors = load_file(str(tiny_files["transformer_bf16"]))
    layer = "transformer_blocks.0.attn.to_q"
    tensors[f"{layer}.comfy_quant"] = comfy_quant(QUANTISED_FORMATS[fmt])
    path = tmp_path / f"qwen_image_2.1_{fmt}.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(UserInputError) as e:
        TransformerFile(path)
    message = str(e.value)
    assert str(path) in message and repr(QUANTISED_FORMATS[fmt]["format"]) in message
    assert "qwen_image_2.1_int8_convrot.safetensors or qwen_image_2.1_fp8_e4m3fn.safetensors" in message


def test_int8_weights_without_comfyuis_entry_are_still_refused(tiny_files, tmp_path):
    from safetensors.torch import load_file, save_file

    from trainer_core.models.transformer_file import TransformerFile

    tensors = to_int8(load_file(str(tiny_files["transformer_bf16"])), lambda k: "to_q" in k)
    tensors = {k: v for k, v in tensors.items() if not k.endswith(".comfy_quant")}
    path = tmp_path / "bare_int8.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(UserInputError, match=r"stores \d+ weights as \['I8'\].*no ComfyUI int8 entry"):
        TransformerFile(path)


def int8_blocks(model, group: int = 256):
    """`model` with every frozen block Linear replaced by comfy-kitchen's int8 of its weight (rotated with `group`),
    stored as the loaders store an int8 file's layer."""
    from trainer_core.models.float8 import dequantized_weight, frozen_block_linears
    from trainer_core.models.streaming import assign_frozen_linear_weight

    for _, linear in frozen_block_linears(model):
        qt, rotated = kitchen_quantize(dequantized_weight(linear, torch.float32), group)
        state = qt.state_dict("weight")
        if hasattr(linear, "weight_scale"):
            del linear.weight_scale
        assign_frozen_linear_weight(linear, state["weight"], state["weight_scale"], group if rotated else 0)
    return model


def test_the_plan_counts_an_int8_models_weights_exactly():
    from trainer_core.devtools.random_weights import random_transformer
    from trainer_core.models.float8 import block_linear_bytes
    from trainer_core.planner import PlanInputs, plan_memory
    from trainer_core.planner.arch import arch_from_transformer

    model = int8_blocks(random_transformer(dict(num_layers=2, num_attention_heads=2), storage="float8"))
    arch = arch_from_transformer(model)
    plan = plan_memory(PlanInputs(storage="int8", device="cpu"), arch)
    bias_bytes = arch.num_blocks * arch.block_linear_bias_params * 2
    assert plan.term("frozen block Linears") + plan.term("row scales") + bias_bytes == block_linear_bytes(model)


@pytest.mark.parametrize("checkpointing", [True, False])
def test_an_int8_models_step_peaks_where_the_plan_says(checkpointing):
    """tests/planner/test_memory.py's whole-model check with int8 ConvRot blocks (group 256): the step's peak, measured by
    `LiveBytes`, against the plan's terms for int8 storage (the upcast weight and the rotated input together)."""
    from conftest import measured_step_peak, planned_step_peak
    from test_memory import NARROW, with_lora

    from trainer_core.devtools.random_weights import random_transformer

    model = int8_blocks(random_transformer(dict(NARROW, num_layers=4), storage="float8"))
    with_lora(model, targets="attention+mlp")
    measured = measured_step_peak(model, 32, 64, checkpointing)
    planned = planned_step_peak(model, 32, 64, checkpointing, storage="int8")
    print(f"checkpointing={checkpointing}: planned {planned}, measured {measured}, {planned / measured:.3f}")
    assert planned == pytest.approx(measured, rel=0.03)
