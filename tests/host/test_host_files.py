"""Host check: our single-file loaders on files ComfyUI itself wrote, not our exporter.

tests/host/comfy_file_writer.py runs with ComfyUI's Python: ComfyUI's own loaders build its Qwen-Image
transformer (one block at the real width), Wan 2.1 VAE (real size) and Qwen2.5-VL text encoder (small)
from seeded random weights, and ComfyUI's own save nodes (ModelSave, CheckpointSave, CLIPSave, VAESave)
write them, in bf16, in ComfyUI's fp8_e4m3fn weight storage and as ComfyUI saves back a model it loaded
from a scaled-fp8 file, with whatever names, prefixes and dtypes ComfyUI chooses (see
trainer_core/models/layouts.py for what they are). Our loaders then read every file, and
- every tensor we load equals the one ComfyUI wrote, bit for bit (float8 stays float8), with names
  mapped by an oracle that is not our loader: the same name (transformer), diffusers' own Wan VAE
  converter (VAE), transformers' `model.language_model.` move (text encoder);
- what our modules compute equals what ComfyUI's modules computed from the same weights (fp32 compute
  on both sides), so the names mean the same thing on both sides.
Needs COMFYUI_PATH and COMFYUI_PYTHON, like the other host tests. The writer takes about a minute and
~5 GB of RAM (the text encoder's vision tower has ComfyUI's fixed width even at a small text config).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from comfy_probe import run_probe
from trainer_core.models.latents import pack_latents, unpack_latents
from trainer_core.models.text_encoder_file import QWEN25_VL_7B_CONFIG, load_text_encoder_file
from trainer_core.models.transformer_file import load_transformer_file
from trainer_core.models.vae_file import load_vae_file

COMFYUI = os.environ.get("COMFYUI_PATH")
pytestmark = pytest.mark.skipif(
    not COMFYUI, reason="COMFYUI_PATH is not set: point it at a ComfyUI checkout (and COMFYUI_PYTHON at a Python "
                        "with ComfyUI's requirements) to load files that ComfyUI itself writes")

# The small text encoder: ComfyUI's Qwen2.5-VL text class keeps Qwen's head size (128) and M-RoPE
# sections (16, 24, 24); 4 KV heads make ComfyUI's CLIP loader see a Qwen2.5-7B (k_proj bias 512).
TEXT_CONFIG = dict(vocab_size=2048, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=4)
LATENT_SIDE = 8  # latent pixels: a 4x4 token grid (even, see DESIGN §9 on odd grids)

# Max |ComfyUI - ours| / max(1, max |ComfyUI|), fp32 compute on both sides: operation order only.
TOLERANCE = 1e-5


def writer_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "latents": torch.randn(1, 16, 1, LATENT_SIDE, LATENT_SIDE, generator=g),  # (B, C, T, h, w)
        "timestep": torch.tensor([0.37]),
        "context": torch.randn(1, 6, 3584, generator=g),  # (B, L, Qwen-Image's joint attention width)
        "image": torch.rand(1, 3, 1, 32, 32, generator=g) * 2 - 1,  # (B, 3, T, H, W)
        "raw_latents": torch.randn(1, 16, 1, 4, 4, generator=g),
        "input_ids": torch.randint(0, TEXT_CONFIG["vocab_size"], (1, 7), generator=g),
    }


@pytest.fixture(scope="module")
def comfy_written(tmp_path_factory):
    """(files by name, ComfyUI's outputs, inputs) from one run of the writer."""
    root = tmp_path_factory.mktemp("comfy_written")
    inputs = writer_inputs()
    save_file(inputs, str(root / "inputs.safetensors"))
    request = {"out_dir": str(root / "models"), "inputs": str(root / "inputs.safetensors"),
               "outputs": str(root / "outputs.safetensors"), "text_config": TEXT_CONFIG, "seed": 0}
    (root / "request.json").write_text(json.dumps(request))
    result = run_probe("comfy_file_writer.py", COMFYUI, root / "request.json", timeout=900)
    files = {name: Path(path) for name, path in json.loads(result.stdout.strip().splitlines()[-1])["files"].items()}
    yield files, load_file(request["outputs"]), inputs
    shutil.rmtree(root / "models", ignore_errors=True)  # ~5 GB: not left for pytest's kept temp folders


def written(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def prefix_of(keys, name: str) -> str:
    """The prefix under which `name` was written (exactly one key must end with it)."""
    found = [k[: -len(name)] for k in keys if k.endswith(name) and (len(k) == len(name) or k[-len(name) - 1] == ".")]
    assert len(found) == 1, (name, found)
    return found[0]


def split_scales(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(tensors, {weight name: its per-tensor scale}) of a scaled-fp8 state dict in either of ComfyUI's
    layouts: 0.3.x's `scaled_fp8` marker and `<layer>.scale_weight`, or 0.33+'s `<layer>.weight_scale` with
    a `<layer>.comfy_quant` entry (JSON bytes naming the format); input scales change no weight."""
    plain, scales = {}, {}
    for name, tensor in tensors.items():
        if name == "scaled_fp8" or name.endswith((".comfy_quant", ".input_scale", ".scale_input")):
            if name.endswith(".comfy_quant"):
                assert json.loads(bytes(tensor.tolist()))["format"] == "float8_e4m3fn", name
            continue
        for suffix in (".scale_weight", ".weight_scale"):
            if name.endswith(suffix):
                scales[name[: -len(suffix)] + ".weight"] = tensor
                break
        else:
            plain[name] = tensor
    return plain, scales


def assert_loaded_exactly(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], what: str) -> None:
    """Our parameters (by name) equal ComfyUI's tensors (mapped to our names) bit for bit: no tensor left out,
    none added, each value exactly as written, float8 kept float8."""
    assert ours.keys() == theirs.keys(), (what, sorted(ours.keys() ^ theirs.keys())[:5])
    for name, tensor in theirs.items():
        mine = ours[name]
        if tensor.dtype == torch.float8_e4m3fn and mine.dtype == torch.float8_e4m3fn:
            assert torch.equal(mine.view(torch.uint8), tensor.view(torch.uint8)), (what, name)
        else:
            assert torch.equal(mine.float(), tensor.float()), (what, name, mine.dtype, tensor.dtype)


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> float:
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    assert torch.isfinite(theirs).all() and theirs.abs().max() > 1e-2, what  # a real output, not ~0
    difference = ((ours.float() - theirs.float()).abs().max() / theirs.abs().max().clamp(min=1)).item()
    print(f"{what}: max |ComfyUI| = {theirs.abs().max().item():.3g}, "
          f"max |ComfyUI - ours| / max(1, max |ComfyUI|) = {difference:.2e}")
    assert difference <= TOLERANCE, (what, difference)
    return difference


@pytest.mark.parametrize("name, storage, output", [
    ("diffusion_models/comfy_model_save_bf16", "bfloat16", "transformer_bf16"),
    ("diffusion_models/comfy_model_save_fp8_e4m3fn", "float8", "transformer_fp8_e4m3fn"),
    ("diffusion_models/comfy_model_save_fp8_e4m3fn_scaled", "float8", "transformer_fp8_e4m3fn_scaled"),
    ("checkpoints/comfy_checkpoint", "bfloat16", "transformer_bf16"),
])
def test_transformer_files_comfyui_wrote(comfy_written, name, storage, output):
    files, outputs, inputs = comfy_written
    tensors = written(files[name])
    prefix = prefix_of(tensors, "txt_norm.weight")
    theirs = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    model = load_transformer_file(files[name], storage=storage, compute_dtype=torch.float32)
    theirs, scales = split_scales(theirs)
    ours = dict(model.named_parameters())
    for weight, scale in scales.items():  # scaled float8: kept as stored with its scale, or dequantized
        module = model.get_submodule(weight.rpartition(".")[0])
        if ours[weight].dtype == torch.float8_e4m3fn:
            assert torch.equal(module.weight_scale, scale.float()), (name, weight)
        else:
            theirs[weight] = theirs[weight].float() * scale.float()
    assert_loaded_exactly(ours, theirs, name)
    if storage == "float8":  # ComfyUI's fp8 weight storage, kept as stored
        assert model.transformer_blocks[0].attn.to_q.weight.dtype == torch.float8_e4m3fn
    if name.endswith("_scaled"):
        assert scales and hasattr(model.transformer_blocks[0].attn.to_q, "weight_scale"), name

    latents = inputs["latents"][:, :, 0]  # (B, C, h, w)
    with torch.no_grad():
        packed = model(hidden_states=pack_latents(latents), encoder_hidden_states=inputs["context"],
                       timestep=inputs["timestep"], img_shapes=[[(1, LATENT_SIDE // 2, LATENT_SIDE // 2)]],
                       return_dict=False)[0]
    assert_close(unpack_latents(packed, LATENT_SIDE, LATENT_SIDE).unsqueeze(2), outputs[output], f"{name} forward")


@pytest.mark.parametrize("name", ["vae/comfy_vae_save", "checkpoints/comfy_checkpoint"])
def test_vae_files_comfyui_wrote(comfy_written, name):
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    files, outputs, inputs = comfy_written
    tensors = written(files[name])
    prefix = prefix_of(tensors, "decoder.middle.0.residual.0.gamma")
    # diffusers' own converter for the real-size Wan 2.1 VAE names the tensors, not ours.
    theirs = convert_wan_vae_to_diffusers({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
    vae = load_vae_file(files[name], compute_dtype=torch.float32)
    assert_loaded_exactly(dict(vae.named_parameters()), theirs, name)

    with torch.no_grad():
        assert_close(vae.encode(inputs["image"]).latent_dist.mode(), outputs["vae_encode"], f"{name} encode")
        assert_close(vae.decode(inputs["raw_latents"]).sample, outputs["vae_decode"], f"{name} decode")


def text_sidecar(path: Path) -> None:
    """The small encoder's config beside its file (the real 7B needs none): Qwen2.5-VL 7B's, resized."""
    config = copy.deepcopy(QWEN25_VL_7B_CONFIG)
    last = TEXT_CONFIG["vocab_size"] - 1  # special token ids must lie inside the small vocabulary
    config["text_config"].update(TEXT_CONFIG, max_window_layers=TEXT_CONFIG["num_hidden_layers"],
                                 bos_token_id=last, eos_token_id=last, pad_token_id=last)
    path.with_suffix(".json").write_text(json.dumps({"part": "text encoder", "format": "bf16", "config": config}))


@pytest.mark.parametrize("name", ["text_encoders/comfy_clip_save", "checkpoints/comfy_checkpoint"])
def test_text_encoder_files_comfyui_wrote(comfy_written, name, tmp_path):
    files, outputs, inputs = comfy_written
    tensors = written(files[name])
    # A link of our own naming, so the config JSON beside it is the text encoder's even for the checkpoint.
    path = tmp_path / "text_encoder.safetensors"
    path.symlink_to(files[name])
    text_sidecar(path)
    prefix = prefix_of(tensors, "model.norm.weight")  # where ComfyUI's Qwen2.5-VL module sits in the file
    language = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix + "model.")}
    theirs = {"model.language_model." + k[len("model."):]: v for k, v in language.items()}  # transformers 5's place
    encoder = load_text_encoder_file(path, compute_dtype=torch.float32)
    assert_loaded_exactly(dict(encoder.named_parameters()), theirs, name)

    with torch.no_grad():
        hidden = encoder(input_ids=inputs["input_ids"], output_hidden_states=True).hidden_states[-1]
    assert_close(hidden, outputs["text_encoder"], f"{name} text encoder")
