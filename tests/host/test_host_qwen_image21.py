"""Host check for Qwen-Image 2.1: ComfyUI's own 2.1 model (comfy/ldm/qwen_image21/model.py) loads our 2.1 transformer
files in bf16 and int8 ConvRot, MLP fused and split, through its UNETLoader node, takes our 2.1 LoRA through its
LoraLoaderModelOnly node with every key, and computes with the LoRA patched in what our loader's model computes with
the same LoRA. tests/host/comfy_qwen21_probe.py runs ComfyUI's side, one process for all files.

The transformer is tiny but has 2.1's real head size: ComfyUI's 2.1 detection reads the widths from the shapes but
not the RoPE axes (it builds with (16, 56, 56), which sum to a head of 128), and every block Linear's input width is
a multiple of 256, so comfy-kitchen rotates each with ConvRot's default group, as ComfyUI's own int8 files are.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from comfy_probe import run_probe
from int8_files import to_int8

COMFYUI = os.environ.get("COMFYUI_PATH")
MODEL_2_1 = Path("comfy/ldm/qwen_image21/model.py")
pytestmark = pytest.mark.skipif(
    not (COMFYUI and (Path(COMFYUI) / MODEL_2_1).is_file()),
    reason="needs COMFYUI_PATH at a ComfyUI that runs Qwen-Image 2.1 (0.37 or newer, or the host docs/comfyui_21_host.md "
           f"builds), i.e. one with {MODEL_2_1} (and COMFYUI_PYTHON at a Python with its requirements and "
           f"comfy-kitchen); COMFYUI_PATH is {COMFYUI or 'not set'}")

CONFIG = dict(patch_size=1, in_channels=16, out_channels=16, num_layers=2, attention_head_dim=128,
              num_attention_heads=2, context_in_dim=32, mlp_ratio=3, axes_dims_rope=(16, 56, 56))
GRID = (4, 6)  # latent H x W: even sides (ComfyUI centres RoPE positions differently on an odd grid, DESIGN section 9)
RANK, ALPHA = 4, 8.0
GROUP = 256  # comfy-kitchen's (and ComfyUI's) ConvRot group
FILES = ("bf16_fused", "bf16_split", "int8_fused", "int8_split")
LAYOUTS = ("comfyui", "diffusers")

# fp32 on both sides from the same bf16 values: the two implementations differ in operation order only (measured:
# relative RMS 2.7e-7 / max 3.2e-7 without the LoRA, 4.0e-7 / 5.4e-7 with it).
BF16_TOLERANCE = 1e-5  # relative max |ComfyUI - ours| / max |ComfyUI|
# int8 files: ComfyUI reads the same weights as we do (checked bit for bit below), but multiplies int8 x int8 with
# its activations quantised to int8 per row (comfy_kitchen.int8_linear) where ours multiplies the rotated fp32
# activations by the int8 weight; with the LoRA it also dequantises, adds the LoRA and quantises the weight again, with
# stochastic rounding. Measured (relative RMS / max): without the LoRA 6.2e-3 / 7.0e-3, with it 1.0e-2 / 1.3e-2 (fused)
# and 9.6e-3 / 1.3e-2 (split), while the LoRA moves the output by 1.7e-1 RMS relative (17x the difference).
INT8_TOLERANCE = 2.5e-2  # relative RMS and relative max, about twice the measured
LORA_OVER_INT8 = 8  # the LoRA's own effect must be this many times the int8 difference
WEIGHT_TOLERANCE = 1e-6  # int8 weights as ComfyUI (comfy-kitchen) dequantises them vs as we hold them: measured 0
# ComfyUI's requantisation after patching rounds stochastically: an RMS error sqrt(2) times the file's own rounding
# to nearest (measured 1.44x: 3.38e-4 against 2.34e-4; it is 5.1e-2 of the LoRA's weight change).
REQUANTISED_OVER_ROUNDING = 2.0


def rms(parts) -> float:
    """The RMS over one tensor or over every tensor of a dict, in double."""
    parts = parts.values() if isinstance(parts, dict) else [parts]
    return torch.cat([p.flatten() for p in parts]).double().pow(2).mean().sqrt().item()


def relative(ours: torch.Tensor, theirs: torch.Tensor) -> tuple[float, float]:
    """(RMS of the difference / RMS of ComfyUI's output, max of the difference / max of ComfyUI's output)."""
    difference = ours - theirs
    return rms(difference) / rms(theirs), (difference.abs().max() / theirs.abs().max()).item()


def tiny_transformer21() -> torch.nn.Module:
    """diffusers' 2.1 transformer at CONFIG with random weights. The norms' scales are random too, so a norm read with
    the wrong offset (2.1's text norm stores scale - 1, its q / k norms the scale) would show. The shared modulation is
    scaled up: at its initial size the blocks' tanh gates are ~1e-2 and the blocks move the output by 1.5% only, so
    a wrong block weight (or LoRA) would hardly show; x30 makes the gates O(1) and the blocks ~half the output."""
    from diffusers import QwenImage21Transformer2DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = QwenImage21Transformer2DModel(**CONFIG)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1:
                    p.add_(torch.randn(p.shape) * 0.1)
            model.modulation[1].weight.mul_(30)
    return model.requires_grad_(False).eval()


def write_files(folder: Path) -> dict[str, Path]:
    """The model as ComfyUI's 2.1 files: our writer's bf16 file, MLP fused and split, and each with its block Linears
    quantised by comfy-kitchen into ComfyUI's int8 ConvRot layers (int8_files.py)."""
    from trainer_core.families.qwen_image21.files import comfyui_transformer_tensors

    model = tiny_transformer21()
    paths = {}
    for mlp in ("fused", "split"):
        tensors = comfyui_transformer_tensors(model, "bf16", mlp)
        int8 = to_int8(tensors, lambda key: ".transformer_blocks." in key, group=GROUP)
        for fmt, data in (("bf16", tensors), ("int8", int8)):
            paths[f"{fmt}_{mlp}"] = folder / f"qwen_image_2.1_tiny_{fmt}_{mlp}.safetensors"
            save_file({k: v.contiguous() for k, v in data.items()}, str(paths[f"{fmt}_{mlp}"]))
    return paths


def load_ours(path: Path, int8: bool = False) -> torch.nn.Module:
    """Our loader's model of a 2.1 file, fp32 compute: bf16 weights in fp32 (exact); an int8 file's blocks kept as
    stored (storage float8 keeps a one-byte weight as the file holds it, with its row scales and rotation)."""
    from trainer_core.families.qwen_image21.files import QwenImage21TransformerFile

    storage = "float8" if int8 else "float32"
    return QwenImage21TransformerFile(path, storage=storage, compute_dtype=torch.float32).load()


def save_our_lora(base: Path, folder: Path) -> dict[str, Path]:
    """A rank-4 LoRA on every 2.1 block Linear of our model of `base` (the 'all' preset), B random so it acts, written
    by our LoRA writer in each layout (what Trainer.save_lora writes)."""
    from trainer_core.adapters.lora import inject_lora, lora_layers
    from trainer_core.adapters.lora_files import layout_metadata, lora_file_tensors, lora_metadata
    from trainer_core.core.config import LoraConfig

    model = load_ours(base)
    cfg = LoraConfig(rank=RANK, alpha=ALPHA, targets="all")
    inject_lora(model, cfg, seed=1)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            b = layer.lora_B["default"].weight
            b.copy_(torch.randn(b.shape, generator=generator) * 0.05)
    paths = {}
    for layout in LAYOUTS:
        paths[layout] = folder / f"lora_{layout}.safetensors"
        save_file(lora_file_tensors(model, RANK, ALPHA, torch.float32, layout), str(paths[layout]),
                  lora_metadata(cfg, 0, "qwen-image-2.1-tiny", layout_metadata(layout, RANK, ALPHA)))
    return paths


@torch.no_grad()
def our_forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Our model's output for ComfyUI's inputs, as (B, C, H, W): the training step's transformer call (objective.py),
    text-to-image, no text mask, the target's tokens row by row after the text's."""
    from trainer_core.families.qwen_image21.objective import transformer_kwargs

    x = inputs["x"]
    b, c, h, w = x.shape
    kwargs = transformer_kwargs(x.flatten(2).transpose(1, 2), (h, w), inputs["context"], None)
    out = model(**kwargs, timestep=inputs["timestep"], return_dict=False)[0][:, -h * w:]  # the target's rows, as
    return out.transpose(1, 2).reshape(b, -1, h, w)                                     # the pipeline keeps them


def with_lora(model: torch.nn.Module, path: Path) -> torch.nn.Module:
    """`model` with the LoRA file read back by our reader and put into a freshly injected adapter."""
    from trainer_core.adapters.lora import inject_lora
    from trainer_core.adapters.lora_reading import load_into_adapter, read_lora_file
    from trainer_core.core.config import LoraConfig

    lora = read_lora_file(path, model=model)
    assert (lora.rank, lora.alpha) == (RANK, ALPHA)
    inject_lora(model, LoraConfig(rank=lora.rank, alpha=lora.alpha, targets="all"), seed=0, modules=list(lora.weights))
    load_into_adapter(model, lora.weights)
    return model


def comfy_block_weights(weights: dict[str, torch.Tensor], fused: bool) -> dict[str, torch.Tensor]:
    """Block Linear weights by our (diffusers') names -> by ComfyUI's module names: the same, but a fused MLP's
    `gate_up` = [gate_layer; proj] (its file's layout, ComfyUI's model's)."""
    out = {k: v for k, v in weights.items() if k.startswith("transformer_blocks.") and v.dim() == 2}
    if fused:
        for gate in [k for k in out if k.endswith("img_mlp.gate_layer.weight")]:
            up = gate.replace("gate_layer", "proj")
            out[gate.replace("gate_layer", "gate_up")] = torch.cat([out.pop(gate), out.pop(up)])
    return out


def block_linears(mlp: str) -> int:
    return CONFIG["num_layers"] * (6 if mlp == "fused" else 7)  # q, k, v, out, MLP out + gate_up or gate_layer, proj


def weight_kind(fmt: str) -> str:
    """How the probe describes a block Linear's weight: int8 files stay comfy-kitchen's int8 ConvRot tensors (also
    once patched: ComfyUI quantises the patched weight again), bf16 files are computed in fp32 on the CPU."""
    return (f"QuantizedTensor torch.float32 TensorWiseINT8Layout convrot={GROUP}" if fmt == "int8"
            else "Parameter torch.float32 None convrot=0")


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    """Our four files and our LoRA, and what ComfyUI made of them (one probe process)."""
    pytest.importorskip("comfy_kitchen")  # the int8 files' writer (ComfyUI's own quantisation library)
    folder = tmp_path_factory.mktemp("qwen21_host")
    files = write_files(folder)
    loras = save_our_lora(files["bf16_fused"], folder)
    # A control: our comfyui-layout file plus one key no model has, which shows that the probe's count of ComfyUI's
    # "not loaded" messages sees the message it counts.
    control = {**load_file(str(loras["comfyui"])), "transformer_blocks.0.attn.to_nothing.lora_A.weight": torch.ones(1)}
    save_file(control, str(folder / "lora_control.safetensors"))
    g = torch.Generator().manual_seed(3)
    inputs = {"x": torch.randn(1, CONFIG["in_channels"], *GRID, generator=g), "timestep": torch.tensor([0.6]),
              "context": torch.randn(1, 5, CONFIG["context_in_dim"], generator=g)}
    save_file(inputs, str(folder / "inputs.safetensors"))
    request = {"models": {k: str(v) for k, v in files.items()},
               "loras": {**{k: str(v) for k, v in loras.items()}, "control": str(folder / "lora_control.safetensors")},
               "inputs": str(folder / "inputs.safetensors"), "out": str(folder / "comfy_out.safetensors"),
               "weights_of": {name: ["base", "comfyui"] for name in FILES if name.startswith("int8")}}
    (folder / "request.json").write_text(json.dumps(request))
    run_probe("comfy_qwen21_probe.py", COMFYUI, folder / "request.json", timeout=600)
    return SimpleNamespace(files=files, loras=loras, inputs=inputs, out=load_file(request["out"]),
                           report=json.loads(Path(request["out"] + ".json").read_text()))


@pytest.mark.parametrize("name", FILES)
def test_comfyuis_unet_loader_detects_qwen_image21_in_our_file(comfy, name):
    """ComfyUI's UNETLoader path built its 2.1 model with our widths and the file's MLP layout, int8 kept int8."""
    fmt, mlp = name.split("_")
    entry = comfy.report[name]
    assert entry["model"] == "QwenImage21", entry
    widths = ("in_channels", "out_channels", "num_layers", "attention_head_dim", "num_attention_heads",
              "context_in_dim", "mlp_ratio")
    assert {k: entry["unet_config"][k] for k in widths} == {k: CONFIG[k] for k in widths}
    assert entry["unet_config"]["fused_mlp"] == (mlp == "fused")
    assert entry["weights"] == {weight_kind(fmt): str(block_linears(mlp))}


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_comfyuis_lora_loader_takes_every_key_of_our_21_lora(comfy, name, layout):
    """LoraLoaderModelOnly on our file: none of ComfyUI's "lora key not loaded" / "NOT LOADED" lines, every block
    Linear patched (a fused gate_up takes both of its halves' LoRAs), the int8 ones still int8 once patched."""
    fmt, mlp = name.split("_")
    lora = comfy.report[name]["loras"][layout]
    assert lora["not_loaded"] == []
    assert lora["patched"] == block_linears(mlp)
    assert lora["weights"] == {weight_kind(fmt): str(block_linears(mlp))}
    control = comfy.report[name]["loras"]["control"]["not_loaded"]
    assert len(control) == 1 and "to_nothing" in control[0], control


@pytest.mark.parametrize("name", FILES)
def test_comfyuis_forward_with_our_lora_equals_ours(comfy, name):
    """ComfyUI's 2.1 forward (LoRA patched in as sampling patches it) against our loader's model of the same file with
    the same LoRA, read back from its file: bf16 to operation order, int8 within ComfyUI's int8 compute (above); the
    LoRA's own effect far larger than any difference."""
    fmt, mlp = name.split("_")
    tolerance = BF16_TOLERANCE if fmt == "bf16" else INT8_TOLERANCE
    model = load_ours(comfy.files[name], int8=fmt == "int8")
    base = our_forward(model, comfy.inputs)
    lines = []
    rms_base, peak = relative(base, comfy.out[f"forward.{name}.base"])
    lines.append(f"{name} without LoRA: relative RMS {rms_base:.1e}, max {peak:.1e}")
    assert peak < tolerance and (fmt == "bf16" or rms_base < tolerance)
    ours = our_forward(with_lora(model, comfy.loras["comfyui"]), comfy.inputs)
    effect, _ = relative(ours, base)
    for layout in LAYOUTS:
        difference, peak = relative(ours, comfy.out[f"forward.{name}.{layout}"])
        lines.append(f"{name} with LoRA ({layout} layout): relative RMS {difference:.1e}, max {peak:.1e}; the LoRA "
                     f"moves ours by {effect:.1e} RMS relative")
        assert peak < tolerance and (fmt == "bf16" or difference < tolerance), layout
        assert effect > LORA_OVER_INT8 * max(difference, rms_base), layout
    print("\n".join(lines))


@pytest.mark.parametrize("mlp", ["fused", "split"])
def test_comfyui_holds_the_int8_weights_we_hold_and_patches_them_with_our_lora(comfy, mlp):
    """The int8 file's block weights as ComfyUI dequantises them equal ours bit for bit (our int8 reading is
    comfy-kitchen's); patched, they are ours + alpha / rank B A but for ComfyUI's requantisation's rounding."""
    from trainer_core.adapters.lora import adapter_weights
    from trainer_core.models.float8 import dequantized_state_dict, rotation_group

    name = f"int8_{mlp}"
    model = load_ours(comfy.files[name], int8=True)
    linears = [m for m in model.transformer_blocks.modules() if isinstance(m, torch.nn.Linear)]
    assert {(m.weight.dtype, rotation_group(m)) for m in linears} == {(torch.int8, GROUP)}  # kept as stored
    ours = comfy_block_weights(dequantized_state_dict(model), mlp == "fused")
    bf16 = comfy_block_weights(dequantized_state_dict(load_ours(comfy.files[f"bf16_{mlp}"])), mlp == "fused")

    def theirs(key: str) -> dict[str, torch.Tensor]:
        prefix = f"weight.{name}.{key}."
        return {k[len(prefix):]: v for k, v in comfy.out.items() if k.startswith(prefix)}

    base = theirs("base")
    assert base.keys() == ours.keys()
    worst = max(((base[k] - w).abs().max() / w.abs().max()).item() for k, w in ours.items())
    assert worst < WEIGHT_TOLERANCE, worst

    with_lora(model, comfy.loras["comfyui"])
    delta = comfy_block_weights({f"{k}.weight": ALPHA / RANK * b @ a for k, (a, b) in adapter_weights(model).items()},
                                mlp == "fused")
    patched = theirs("comfyui")
    assert patched.keys() == delta.keys() == ours.keys()
    error = rms({k: patched[k] - ours[k] - delta[k] for k in delta})
    own = rms({k: ours[k] - bf16[k] for k in delta})  # the int8 file's own rounding of the bf16 weights
    print(f"{name}: max |ComfyUI's int8 weight - ours| / max |ours| = {worst:.1e}; patched: RMS of ComfyUI's - "
          f"(ours + alpha/rank B A) = {error:.2e} ({error / rms(delta):.1e} of the LoRA's change), the file's own "
          f"rounding {own:.2e}")
    assert error < REQUANTISED_OVER_ROUNDING * own
