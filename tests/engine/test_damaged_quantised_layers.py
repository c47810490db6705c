"""A damaged quantised layer is refused when its file is read, naming the file, the layer and what is wrong, before
anything trains (issue 54): every file here is written by comfy-kitchen's quantiser in ComfyUI's layout
(int8_files.py) and then damaged one way, as a broken download, a foreign converter or a hand edit would. The same
checks hold for every reader: the Qwen-Image transformer, the 2.1 transformer, the Qwen2.5-VL text encoder, and
2.1's Qwen3-VL (its language layers for caching, its vision layers for the captioner)."""

import json

import pytest
import torch

from int8_files import comfy_quant, kitchen_dequantized, to_int8
from trainer_core.core.errors import UserInputError

pytest.importorskip("comfy_kitchen")

LAYER = "transformer_blocks.0.attn.to_q"  # (32, 32) in the tiny Qwen-Image
PREFIX = "model.diffusion_model."  # the 2.1 file's; readers name layers without it
WIDE = "transformer_blocks.0.img_mlp.net.0.proj"  # (128, 32): its (1, out) scale differs from (out, 1)


def _save(tensors, path, tiny_files, metadata=None):
    """`tensors` as a safetensors file at `path`, with the tiny model's config JSON beside it."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    path.with_suffix(".json").write_text(tiny_files["transformer_bf16"].with_suffix(".json").read_text())
    return path


@pytest.fixture(scope="module")
def int8_tensors(tiny_files):
    """The tiny Qwen-Image transformer with every block Linear in comfy-kitchen's int8 ConvRot (group 16)."""
    from safetensors.torch import load_file

    return to_int8(load_file(str(tiny_files["transformer_bf16"])), lambda k: "transformer_blocks." in k, group=16)


def _as_bf16(tensors, layer):
    out = dict(tensors)
    out[f"{layer}.weight"] = kitchen_dequantized({k: v for k, v in tensors.items() if k.startswith(layer + ".")})[
        f"{layer}.weight"].bfloat16()
    return out


def _set(key, value):
    return lambda t: {**t, key: value}


def _drop(key):
    return lambda t: {k: v for k, v in t.items() if k != key}


def _scale(layer, change):
    return lambda t: {**t, f"{layer}.weight_scale": change(t[f"{layer}.weight_scale"])}


def _quant(layer, config):
    return _set(f"{layer}.comfy_quant", comfy_quant(config))


_INT8 = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 16}

# damage -> (how, what the message says)
DAMAGES = {
    "int8 declared, bf16 weight": (lambda t: _as_bf16(t, LAYER), "is declared int8_tensorwise but its weight is stored as BF16"),
    "int8 declared, float8 weight": (
        lambda t: {**t, f"{LAYER}.weight": _as_bf16(t, LAYER)[f"{LAYER}.weight"].to(torch.float8_e4m3fn)},
        "is declared int8_tensorwise but its weight is stored as F8_E4M3"),
    "no weight_scale": (_drop(f"{LAYER}.weight_scale"), f"has no {LAYER}.weight_scale"),
    "scale shaped (1, out)": (_scale(WIDE, lambda s: s.reshape(1, -1).contiguous()), "shape (1, 128), not () or (128, 1)"),
    "scale shaped (out,)": (_scale(WIDE, lambda s: s.reshape(-1).contiguous()), "shape (128,), not () or (128, 1)"),
    "all-zero scale": (_scale(LAYER, torch.zeros_like), "weight scale is all zero"),
    "NaN in the scale": (_scale(LAYER, lambda s: torch.where(torch.arange(s.numel()).reshape(s.shape) == 3,
                                                             float("nan"), s)), "weight scale holds NaN or inf"),
    "negative scale": (_scale(LAYER, torch.neg), "weight scale is negative"),
    "integer scale": (_scale(LAYER, lambda s: s.to(torch.int32)), "weight scale is stored as I32"),
    "group larger than the width": (_quant(LAYER, {**_INT8, "convrot_groupsize": 64}),
                                    "ConvRot group of 64, which does not divide its 32 input features"),
    "group not dividing the width": (_quant(WIDE.replace("net.0.proj", "net.2"), {**_INT8, "convrot_groupsize": 256}),
                                     "ConvRot group of 256, which does not divide its 128 input features"),
    "group not a power of 4": (_quant(LAYER, {**_INT8, "convrot_groupsize": 8}), "a ConvRot group of 8 is not a power of 4"),
    "comfy_quant not JSON": (_set(f"{LAYER}.comfy_quant", torch.tensor(list(b"\xff{format"), dtype=torch.uint8)),
                             f"entry {LAYER}.comfy_quant is not JSON"),
    "comfy_quant a list": (_set(f"{LAYER}.comfy_quant", comfy_quant(["int8_tensorwise"])), "holds list JSON"),
    "int8 bias": (_set(f"{LAYER}.bias", torch.zeros(32, dtype=torch.int8)), "bias is stored as I8"),
    "quantised layer without its weight": (_quant("transformer_blocks.0.attn.to_nothing", _INT8),
                                           "the file holds no transformer_blocks.0.attn.to_nothing.weight"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_int8_layer_is_refused_naming_the_file_the_layer_and_what_is_wrong(int8_tensors, tmp_path, damage):
    from safetensors.torch import save_file

    from trainer_core.models.transformer_file import TransformerFile

    how, says = DAMAGES[damage]
    path = tmp_path / "qwen_image_int8_convrot.safetensors"
    save_file({k: v.contiguous() for k, v in how(int8_tensors).items()}, str(path))
    with pytest.raises(UserInputError) as e:
        TransformerFile(path, storage="float8", compute_dtype=torch.float32)
    message = str(e.value)
    assert str(path) in message and says in message, message
    assert "qwen_image_fp8_e4m3fn.safetensors or qwen_image_bf16.safetensors" in message  # the files to choose


def test_the_undamaged_file_and_a_mixed_one_read(int8_tensors, tiny_files, tmp_path):
    """A layer quantised in one block and not the next is read as it is: ComfyUI's mixed files keep layers in bf16
    on purpose (its fp8mixed files; its converter's layers a group does not divide)."""
    from trainer_core.models.float8 import dequantized_state_dict
    from trainer_core.models.transformer_file import TransformerFile

    mixed = {k: v for k, v in int8_tensors.items() if not k.startswith("transformer_blocks.1.")}
    for key, tensor in _as_bf16(int8_tensors, "transformer_blocks.1.attn.to_q").items():
        if key.startswith("transformer_blocks.1."):
            if key.startswith("transformer_blocks.1.attn.to_q."):
                if key.endswith((".weight", ".bias")):
                    mixed[key] = tensor
            else:
                mixed[key] = tensor
    path = _save(mixed, tmp_path / "mixed.safetensors", tiny_files)
    model = TransformerFile(path, storage="float8", compute_dtype=torch.float32).load()
    assert model.transformer_blocks[1].attn.to_q.weight.dtype == torch.float8_e4m3fn  # bf16 in the file: float8 storage
    assert model.transformer_blocks[0].attn.to_q.weight.dtype == torch.int8
    got = dequantized_state_dict(model)
    for key, weight in kitchen_dequantized(mixed).items():
        assert torch.equal(got[key], weight), key


def _header(tensors, drop_entries: bool, version="1.0", override=None):
    """ComfyUI's `_quantization_metadata` header entry for every layer with a comfy_quant entry."""
    layers = {k[: -len(".comfy_quant")]: json.loads(bytes(v.tolist()).decode()) for k, v in tensors.items()
              if k.endswith(".comfy_quant")}
    layers.update(override or {})
    kept = {k: v for k, v in tensors.items() if not (drop_entries and k.endswith(".comfy_quant"))}
    return kept, {"_quantization_metadata": json.dumps({"format_version": version, "layers": layers})}


def test_a_file_that_describes_its_layers_only_in_the_header_reads(int8_tensors, tiny_files, tmp_path):
    from trainer_core.models.float8 import dequantized_state_dict
    from trainer_core.models.transformer_file import TransformerFile

    tensors, metadata = _header(int8_tensors, drop_entries=True)
    assert not any(k.endswith(".comfy_quant") for k in tensors)
    path = _save(tensors, tmp_path / "header_only.safetensors", tiny_files, metadata)
    source = TransformerFile(path, storage="float8", compute_dtype=torch.float32)
    assert source.int8 and set(source.int8.values()) == {16}
    got = dequantized_state_dict(source.load())
    for key, weight in kitchen_dequantized(int8_tensors).items():
        assert torch.equal(got[key], weight), key


def test_a_header_that_disagrees_with_a_layers_entry_is_refused_by_name(int8_tensors, tmp_path):
    from safetensors.torch import save_file

    from trainer_core.models.transformer_file import TransformerFile

    tensors, metadata = _header(int8_tensors, drop_entries=False, override={LAYER: {"format": "float8_e4m3fn"}})
    path = tmp_path / "disagrees.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    with pytest.raises(UserInputError, match=rf"{path}: layer {LAYER} is .*int8_tensorwise.* by its comfy_quant entry "
                                             r"but .*float8_e4m3fn.* by the header's _quantization_metadata"):
        TransformerFile(path)
    tensors, metadata = _header(int8_tensors, drop_entries=False, version="2.0")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    with pytest.raises(UserInputError, match="format_version 2.0; this pack reads version 1"):
        TransformerFile(path)


# The other readers: one damage each that trained silently before (a (1, out) scale broadcast across columns; a
# missing scale left the codes as weights) and one that crashed (a group the width does not take).
def _damaged_copy(source, target, key_of, damage):
    from safetensors.torch import load_file, save_file

    tensors = to_int8(load_file(str(source)), lambda k: True, group=16)
    layer = key_of(tensors)
    if damage == "row scale":
        tensors[f"{layer}.weight_scale"] = tensors[f"{layer}.weight_scale"].reshape(1, -1).contiguous()
    elif damage == "no scale":
        del tensors[f"{layer}.weight_scale"]
    else:
        tensors[f"{layer}.comfy_quant"] = comfy_quant({**_INT8, "convrot_groupsize": 64})
    save_file(tensors, str(target))
    sidecar = source.with_suffix(".json")
    if sidecar.is_file():
        target.with_suffix(".json").write_text(sidecar.read_text())
    return layer


@pytest.fixture(scope="module")
def files21(tmp_path_factory):
    from trainer_core.families import get_family

    return get_family("qwen-image-2.1").export_tiny(tmp_path_factory.mktemp("tiny21"), layout="comfyui")


def _first(tensors, needle):
    return next(k[: -len(".weight")] for k, v in tensors.items() if needle in k and k.endswith(".weight")
                and v.dtype == torch.int8 and v.shape[0] > 1)


READERS = {
    "2.1 transformer": ("transformer_bf16", lambda t: _first(t, "transformer_blocks.0.attn.to_q")),
    "2.1 text encoder (caching)": ("text_encoder", lambda t: _first(t, "model.layers.0.self_attn.q_proj")),
    "Qwen3-VL vision (captioner)": ("text_encoder", lambda t: _first(t, "visual.blocks.0.attn.qkv")),
    "Qwen2.5-VL text encoder": ("text_encoder_bf16", lambda t: _first(t, "model.layers.0.self_attn.q_proj")),
}


def _read(reader, path):
    if reader == "2.1 transformer":
        from trainer_core.families.qwen_image21.files import QwenImage21TransformerFile

        return QwenImage21TransformerFile(path, storage="float8", compute_dtype=torch.float32)
    if reader == "Qwen2.5-VL text encoder":
        from trainer_core.models.text_encoder_file import TextEncoderFile

        return TextEncoderFile(path, torch.float32, "keep", vision=True)()
    from trainer_core.families.qwen_image21.text_file import load_qwen3_vl_file

    return load_qwen3_vl_file(path, torch.float32, "keep", head=reader.startswith("Qwen3-VL vision"))


@pytest.mark.parametrize("damage", ["row scale", "no scale", "group"])
@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_a_damaged_layer_by_name(tiny_files, files21, tmp_path, reader, damage):
    part, key_of = READERS[reader]
    source = (tiny_files if reader.startswith("Qwen2.5") else files21)[part]
    target = tmp_path / "damaged_int8_convrot.safetensors"
    layer = _damaged_copy(source, target, key_of, damage)
    with pytest.raises(UserInputError) as e:
        _read(reader, target)
    message = str(e.value)
    says = {"row scale": "scale has shape (1,", "no scale": f"has no {layer.removeprefix(PREFIX)}.weight_scale",
            "group": "ConvRot group of 64, which does not divide"}[damage]
    assert str(target) in message and f"layer {layer.removeprefix(PREFIX)}" in message and says in message, message
