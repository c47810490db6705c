"""Key conventions of single model files: part detection, key prefixes, ComfyUI's scaled-fp8 tensors.

Facts from ComfyUI 0.3.64 (read, not copied):
- comfy/model_detection.py recognises a Qwen-Image transformer by `<prefix>txt_norm.weight`; the keys
  are diffusers' module names. Our loader accepts the prefixes ComfyUI looks for and those other tools
  write (DESIGN §9: ComfyUI itself takes bare, `model.diffusion_model.` and `model.`).
- Scaled fp8 files (comfy/ops.py `scaled_fp8_ops`, comfy/model_detection.py, comfy/text_encoders/
  hunyuan_video.py `llama_detect`): a marker tensor `<prefix>scaled_fp8` (empty; its dtype is the fp8
  format), and per Linear `<module>.scale_weight` (fp32 scalar: real weight = fp8 weight * scale_weight)
  and optionally `<module>.scale_input` (only used by fp8 matrix multiplication on the activations; it
  does not change the weight, so loaders that compute in bf16/fp32 ignore it). ComfyUI 0.33.0 has no
  `scaled_fp8_ops` but still reads these files (comfy/utils.py `convert_old_quants`).
- ComfyUI 0.33.0's own layout for quantized layers (comfy/ops.py `mixed_precision_ops`, which is what
  its ModelSave writes for a model loaded from a scaled-fp8 file): per layer `<module>.weight` (float8),
  `<module>.weight_scale` (fp32 scalar, same meaning as `scale_weight`), optionally `.input_scale`, and
  `<module>.comfy_quant`, a uint8 tensor of JSON bytes naming the format ({"format": "float8_e4m3fn"});
  or the same per-layer JSON in the file's `_quantization_metadata`. Per-tensor float8 formats and int8
  ("int8_tensorwise", ConvRot-rotated or not: int8_convrot.py, whose `weight_scale` is one scale per row) are
  read here; the others (nvfp4, mxfp8, the 4-bit w4a8 and w4a4 formats, block-scaled float8) are refused by name,
  naming the file of the same model to choose instead.
- What ComfyUI's own save nodes write (tests/host/test_host_files.py, 0.3.64 and 0.33.0): ModelSave and
  CheckpointSave put the transformer under `model.diffusion_model.`; a checkpoint holds the encoder
  under `text_encoders.qwen25_7b.transformer.` and the VAE under `vae.`; CLIPSave writes the encoder
  under `qwen25_7b.transformer.`, VAESave the VAE bare. With `weight_dtype fp8_e4m3fn` every transformer
  tensor (biases and norms too) is float8.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import torch

from ..core.errors import UserInputError
from .int8_convrot import INT8_FORMAT, rotation_group

SCALED_FP8_MARKER = "scaled_fp8"
# ComfyUI 0.33's marker of a Qwen-Image-Edit-2511 transformer (an empty buffer; families/qwen_image_edit/variants.py reads it).
EDIT_2511_MARKER = "__index_timestep_zero__"
SCALE_WEIGHT = ".scale_weight"
SCALE_INPUT = ".scale_input"
# ComfyUI 0.33+'s names for quantized layers (see the module docstring).
WEIGHT_SCALE = ".weight_scale"
INPUT_SCALE = ".input_scale"
COMFY_QUANT = ".comfy_quant"
QUANTIZATION_METADATA = "_quantization_metadata"
PER_TENSOR_FLOAT8_FORMATS = ("float8_e4m3fn", "float8_e5m2")
READ_FORMATS = (*PER_TENSOR_FLOAT8_FORMATS, INT8_FORMAT)
# Entries that are not weights but preferences for how ComfyUI runs the model (ComfyUI #16419, #16831): left out.
RUNTIME_SUFFIXES = (".comfy_attention.config",)
FLOATING = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")

# Most specific first: "model." would also match the start of "model.diffusion_model.".
TRANSFORMER_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "transformer.", "model.", "")
TRANSFORMER_PROBE = "txt_norm.weight"  # what ComfyUI detects Qwen-Image by

# ComfyUI's single-file text encoders are bare (`model.layers.*`); a checkpoint that embeds the encoder
# uses ComfyUI's own module path, and ComfyUI's CLIPSave node writes the encoder under that path less
# `text_encoders.` (it strips only the prefixes of the encoders it knows by name, not Qwen's).
TEXT_ENCODER_PREFIXES = ("text_encoders.qwen25_7b.transformer.", "qwen25_7b.transformer.", "")
TEXT_ENCODER_PROBES = ("model.layers.0.self_attn.q_proj.weight", "model.language_model.layers.0.self_attn.q_proj.weight")

VAE_PREFIXES = ("first_stage_model.", "vae.", "")
VAE_PROBE_WAN = "decoder.middle.0.residual.0.gamma"  # what ComfyUI detects the Wan 2.1 VAE by
VAE_PROBE_DIFFUSERS = "decoder.mid_block.resnets.0.norm1.gamma"

WHAT_TO_CHOOSE = {
    "transformer": "qwen_image_fp8_e4m3fn.safetensors or qwen_image_bf16.safetensors (ComfyUI folder "
                   "models/diffusion_models)",
    "text encoder": "qwen_2.5_vl_7b_fp8_scaled.safetensors or qwen_2.5_vl_7b.safetensors (ComfyUI folder "
                    "models/text_encoders)",
    "vae": "qwen_image_vae.safetensors (ComfyUI folder models/vae)",
}


# part -> [(layout, probe keys, prefixes)], in the order they are tried.
PART_LAYOUTS = {
    "transformer": [("diffusers", (TRANSFORMER_PROBE,), TRANSFORMER_PREFIXES)],
    "text encoder": [("qwen2.5-vl", TEXT_ENCODER_PROBES, TEXT_ENCODER_PREFIXES)],
    "vae": [("wan", (VAE_PROBE_WAN,), VAE_PREFIXES), ("diffusers", (VAE_PROBE_DIFFUSERS,), VAE_PREFIXES)],
}


def detect_layout(path, part: str, keys: Iterable[str]) -> tuple[str, str]:
    """(layout, key prefix) of a file chosen as `part`; a `UserInputError` when it is no such part."""
    keys = list(keys)
    for layout, probes, prefixes in PART_LAYOUTS[part]:
        prefix = find_prefix(keys, probes, prefixes)
        if prefix is not None:
            return layout, prefix
    raise wrong_file(path, part, keys)


def find_prefix(keys: Iterable[str], probes: Iterable[str], prefixes: Iterable[str]) -> str | None:
    """The first prefix P for which P + probe is a key, for any probe; None if none matches."""
    keys = set(keys)
    for prefix in prefixes:
        if any(prefix + probe in keys for probe in probes):
            return prefix
    return None


def strip_prefix(keys: Iterable[str], prefix: str) -> dict[str, str]:
    """Name without `prefix` -> key in the file, for the keys under `prefix`.

    Keys outside a non-empty prefix belong to other parts of an all-in-one checkpoint and are left out.
    """
    return {k[len(prefix):]: k for k in keys if k.startswith(prefix)}


def is_runtime_entry(name: str) -> bool:
    """Whether `name` is one of ComfyUI's runtime entries: not a weight, a preference for how ComfyUI runs the model
    (`<module>.comfy_attention.config`, uint8 JSON naming an attention backend; comfy/ldm/modules/attention.py)."""
    return name.endswith(RUNTIME_SUFFIXES)


def runtime_entries(file, names: dict[str, str]) -> dict[str, dict]:
    """Name -> the JSON of every runtime entry among `names` (name -> file key); an entry that is not JSON reads as
    {} (it is left out either way: nothing here runs on it)."""
    out = {}
    for name, key in names.items():
        if is_runtime_entry(name):
            try:
                value = json.loads(bytes(file.tensor(key).reshape(-1).tolist()).rstrip(b"\0").decode("utf-8"))
            except (ValueError, TypeError):
                value = {}
            out[name] = value if isinstance(value, dict) else {}
    return out


def runtime_note(file, names: dict[str, str]) -> str | None:
    """One line for the run's status naming what the file's runtime entries ask ComfyUI for (None: it has none), e.g.
    "transformer file F asks ComfyUI for comfy_kitchen_int8 attention in 60 blocks; training uses standard attention"."""
    entries = runtime_entries(file, names)
    if not entries:
        return None
    asked: dict[str, int] = {}
    for value in entries.values():
        choice = value.get("attention")
        choice = choice if isinstance(choice, str) else ", then ".join(map(str, choice)) if isinstance(
            choice, list) else "a backend"
        asked[choice] = asked.get(choice, 0) + 1
    wants = "; ".join(f"{choice} attention in {n} {'block' if n == 1 else 'blocks'}" for choice, n in asked.items())
    return (f"{file.part} file {file.path.name} asks ComfyUI for {wants}; training uses standard attention "
            f"(the entries are left out of the model)")


def split_scaled_fp8(names: dict[str, str], file=None) -> tuple[dict[str, str], dict[str, str]]:
    """Split (name -> file key) into (tensors, {weight name: file key of its scale}).

    A scale is `scale_weight` (ComfyUI's scaled-fp8 files) or `weight_scale` (ComfyUI 0.33+'s quantized
    layers). The `scaled_fp8` marker, input scales, `comfy_quant` entries and runtime entries
    (`comfy_attention.config`: `is_runtime_entry`) are dropped (see the module docstring). Given the
    `SafetensorsFile`, every quantized layer is checked (`check_quantised_layers`): a layer in a format not read
    here, or one whose weight, scale, rotation or bias does not fit its declared format, is refused by name.
    """
    if file is not None:
        check_quantised_layers(file, names)
    tensors, scales = {}, {}
    for name, key in names.items():
        if (name in (SCALED_FP8_MARKER, EDIT_2511_MARKER) or is_runtime_entry(name)
                or name.endswith((SCALE_INPUT, INPUT_SCALE, COMFY_QUANT))):
            continue
        for suffix in (SCALE_WEIGHT, WEIGHT_SCALE):
            if name.endswith(suffix):
                scales[name[: -len(suffix)] + ".weight"] = key
                break
        else:
            tensors[name] = key
    return tensors, scales


def refuse_nonfinite_scales(file, scales: dict) -> None:
    """Refuse a scaled-fp8 file whose weight scales (file key -> tensor) hold NaN or inf: every weight they
    scale would be NaN, and training would only ever skip steps."""
    from ..core.finite import nonfinite_names

    bad = nonfinite_names(scales)
    if bad:
        raise UserInputError(f"{file.part} file {file.path} has NaN or inf weight scales ({len(bad)}, first: {bad[:3]}): "
                             "the file is damaged. Download it again, or choose the bf16 file.")


def _damaged(file, detail: str) -> UserInputError:
    return UserInputError(f"{file.part} file {file.path}: {detail}. The file is damaged or was not written by "
                          f"ComfyUI's quantiser: download it again, or choose {same_model_files(file.path)}.")


def _json_entry(file, key: str) -> dict:
    raw = bytes(file.tensor(key).reshape(-1).tolist()).rstrip(b"\0")
    try:
        config = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise _damaged(file, f"entry {key} is not JSON ({e})") from e
    if not isinstance(config, dict):
        raise _damaged(file, f"entry {key} holds {type(config).__name__} JSON, not an object naming a format")
    return config


def header_quantization(file) -> dict[str, dict]:
    """File key of a layer (its weight's key less `.weight`) -> its config, from the header's `_quantization_metadata`
    (`{"format_version": "1.0", "layers": {layer: {"format": ...}}}`); {} when the header has none."""
    if QUANTIZATION_METADATA not in file.metadata:
        return {}
    try:
        meta = json.loads(file.metadata[QUANTIZATION_METADATA])
    except ValueError as e:
        raise _damaged(file, f"the header's {QUANTIZATION_METADATA} is not JSON ({e})") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("layers", {}), dict):
        raise _damaged(file, f"the header's {QUANTIZATION_METADATA} is not an object with a 'layers' object")
    version = str(meta.get("format_version", "1.0"))
    if version.split(".")[0] != "1":
        raise UserInputError(
            f"{file.part} file {file.path}: its header's {QUANTIZATION_METADATA} is format_version {version}; this pack "
            f"reads version 1 (what ComfyUI writes). Choose {same_model_files(file.path)}.")
    out = {}
    for layer, conf in meta.get("layers", {}).items():
        if not isinstance(conf, dict):
            raise _damaged(file, f"the header's {QUANTIZATION_METADATA} entry of layer {layer} is not an object")
        out[layer] = dict(conf)
    return out


def _same_config(a: dict, b: dict) -> bool:
    """Whether two descriptions of one layer agree on what decides its reading: the format and, for int8, the rotation."""
    if a.get("format") != b.get("format"):
        return False
    if a.get("format") == INT8_FORMAT:
        try:
            return rotation_group(a) == rotation_group(b)
        except ValueError:
            return False
    return True


def quantization_configs(file, names: dict[str, str] | None = None) -> dict[str, dict]:
    """Layer name -> its quantization config (the `comfy_quant` JSON, or the file's `_quantization_metadata` entry),
    for every quantized layer of `file`. `names` (name -> file key, e.g. without the file's prefix) names the layers;
    by default their file keys. A layer the two describe differently is refused by name; header entries for layers
    outside `names` (another part of a checkpoint) are left to that part. A `UserInputError` when an entry cannot be
    read."""
    names = {k: k for k in file.keys} if names is None else names
    name_of = {key: name for name, key in names.items()}
    configs: dict[str, dict] = {}
    for layer_key, conf in header_quantization(file).items():
        weight = name_of.get(f"{layer_key}.weight")
        if weight is not None:
            configs[weight.removesuffix(".weight")] = conf
    for name, key in names.items():
        if name.endswith(COMFY_QUANT):
            layer = name[: -len(COMFY_QUANT)]
            conf = _json_entry(file, key)
            if layer in configs and not _same_config(configs[layer], conf):
                raise _damaged(file, f"layer {layer} is {conf} by its comfy_quant entry but {configs[layer]} by the "
                                     f"header's {QUANTIZATION_METADATA}: the two disagree")
            configs[layer] = conf
    return configs


# What a layer's weight is stored as, by its declared format (safetensors' dtype names).
_WEIGHT_DTYPE = {INT8_FORMAT: "I8", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
_SCALE_DTYPES = ("F32", "F16", "BF16")


def _check_layer(file, names: dict[str, str], layer: str, conf: dict) -> str | None:
    """What is wrong with one quantised layer of a format read here (None: nothing). Header facts first (dtypes,
    shapes, presence), then the scale's values (a few bytes a row)."""
    fmt = conf["format"]
    weight_key = names.get(f"{layer}.weight")
    if weight_key is None:
        return f"layer {layer} is declared {fmt} but the file holds no {layer}.weight"
    stored = file.dtype_name(weight_key)
    if stored != _WEIGHT_DTYPE[fmt]:
        return f"layer {layer} is declared {fmt} but its weight is stored as {stored}, not {_WEIGHT_DTYPE[fmt]}"
    shape = file.shapes[weight_key]
    if fmt == INT8_FORMAT and len(shape) != 2:
        return f"layer {layer} is declared {fmt} but its weight has shape {shape}, not (out, in)"
    bias_key = names.get(f"{layer}.bias")
    if bias_key is not None and file.dtype_name(bias_key) not in FLOATING:
        return f"layer {layer}'s bias is stored as {file.dtype_name(bias_key)}: ComfyUI keeps biases in floating point"
    if fmt == INT8_FORMAT:
        try:
            group = rotation_group(conf)
        except ValueError as e:
            return f"layer {layer} has {e} (ComfyUI writes powers of 4, 256 by default)"
        if group and shape[1] % group:
            return (f"layer {layer} has a ConvRot group of {group}, which does not divide its {shape[1]} input features "
                    "(ComfyUI rotates only layers whose width the group divides)")
    scale_key = names.get(f"{layer}{WEIGHT_SCALE}") or names.get(f"{layer}{SCALE_WEIGHT}")
    if scale_key is None:
        if fmt == INT8_FORMAT:
            return f"layer {layer} is declared {fmt} but has no {layer}{WEIGHT_SCALE}: its int8 codes mean nothing alone"
        return None  # a float8 weight without a scale is its own value (scale 1), as ComfyUI reads it
    scale_dtype, scale_shape = file.dtype_name(scale_key), file.shapes[scale_key]
    if scale_dtype not in _SCALE_DTYPES:
        return f"layer {layer}'s weight scale is stored as {scale_dtype}, not as floating point (F32)"
    per_row = fmt == INT8_FORMAT and scale_shape == (shape[0], 1)
    if not (per_row or scale_shape in ((), (1,), (1, 1))):
        wanted = f"() or ({shape[0]}, 1)" if fmt == INT8_FORMAT else "() (one scale per weight)"
        return f"layer {layer}'s weight scale has shape {scale_shape}, not {wanted}: it would scale the wrong numbers"
    scale = file.tensor(scale_key).float()
    if not torch.isfinite(scale).all():
        return f"layer {layer}'s weight scale holds NaN or inf"
    if (scale < 0).any():
        return f"layer {layer}'s weight scale is negative"
    if not scale.any():
        return f"layer {layer}'s weight scale is all zero: every weight of the layer would be 0"
    return None


def check_quantised_layers(file, names: dict[str, str]) -> dict[str, dict]:
    """Check every quantised layer of `file` among `names` (name -> file key) when the file is read, before anything
    trains; return layer name -> its config. Refused, naming the file, the layer and what is wrong: a format not read
    here (READ_FORMATS; the message names the files to choose), a weight stored in another dtype than its format's, a
    missing or misshapen int8 scale ((out, 1) or a scalar; a (1, out) one would scale columns), a scale not finite,
    negative or all zero, a ConvRot group that is not a power of 4 or does not divide the layer's input width, a bias
    not in floating point. A layer quantised in one block and not the next is read as it is: ComfyUI's mixed files
    (fp8mixed) keep some layers in bf16 on purpose. Checked once per file and names."""
    cache = file.__dict__.setdefault("_checked_quantised", {})
    token = tuple(sorted(names.items()))
    if token in cache:
        return cache[token]
    configs = quantization_configs(file, names)
    other = {layer: conf.get("format") for layer, conf in configs.items() if conf.get("format") not in READ_FORMATS}
    if other:
        layer, fmt = next(iter(sorted(other.items())))
        raise UserInputError(
            f"{file.part} file {file.path} has layers quantized as {sorted({str(f) for f in other.values()})} "
            f"({len(other)} layers; first: layer {layer}, format {fmt!r}), a format ComfyUI reads but this pack does not "
            f"(it reads bf16, float8 with one scale per weight, and int8 / int8 ConvRot). Choose "
            f"{same_model_files(file.path)}.")
    problems = [p for layer, conf in sorted(configs.items()) if (p := _check_layer(file, names, layer, conf))]
    if problems:
        more = f" ({len(problems) - 1} more layers are damaged too)" if len(problems) > 1 else ""
        raise _damaged(file, problems[0] + more)
    cache[token] = configs
    return configs


def int8_weights(file, names: dict[str, str]) -> dict[str, int]:
    """Weight name -> the ConvRot group of its rotation (0: none) for every int8 layer of `file` (names as in
    `quantization_configs`), each layer checked (`check_quantised_layers`)."""
    return {f"{layer}.weight": rotation_group(conf) for layer, conf in check_quantised_layers(file, names).items()
            if conf.get("format") == INT8_FORMAT}


# ComfyUI's file names end in the storage format (qwen_image_2.1_int8_convrot, qwen_image_edit_2511_fp8mixed).
_FORMAT_SUFFIX = re.compile(r"[._-](bf16|fp16|fp32|fp8_e4m3fn(_scaled)?|fp8_?mixed|fp8_scaled|int8_convrot|int8|nvfp4"
                            r"(_mixed)?|mxfp8(_mixed)?|(asym_)?w4a8(_\w+)?|(convrot_)?w4a4(_\w+)?|(awq_)?w4a16|int4(_\w+)?)$",
                            re.IGNORECASE)


def same_model_files(path) -> str:
    """The names of the same model's files in the formats read here, when `path`'s name ends in a format (ComfyUI's
    convention), else the formats themselves."""
    from pathlib import Path

    stem = Path(path).stem
    match = _FORMAT_SUFFIX.search(stem)
    if match is None:
        return "its bf16, fp8 or int8 ConvRot file"
    base = stem[: match.start()]
    formats = _SHIPPED_FORMATS.get(base, ("int8_convrot", "fp8_e4m3fn", "bf16"))
    return " or ".join(f"{base}_{fmt}.safetensors" for fmt in formats)


# Models whose files Comfy-Org ships in fewer formats than the three read here (DESIGN.md section 12: 2.1's text
# encoder comes as int8 ConvRot, bf16 and w4a8, no fp8), so a message never names a file that does not exist.
_SHIPPED_FORMATS = {"qwen3vl_8b": ("int8_convrot", "bf16")}


# (substring of some key, what the file then is), checked in order.
_SIGNATURES = (
    (("lora_A.", "lora_B.", "lora_down.", "lora_up."), "a LoRA, not a base model"),
    (("input_blocks.0.0.weight", "conditioner.embedders."), "a Stable Diffusion / SDXL checkpoint"),
    (("double_blocks.0.",), "a Flux-style transformer"),
    (("decoder.upsamples.0.upsamples.0.",), "the Wan 2.2 VAE (48 latent channels), not Qwen-Image's VAE"),
    (("decoder.middle.0.residual.0.gamma", "decoder.mid_block.resnets.0.norm1.gamma"), "a Wan 2.1 / Qwen-Image VAE"),
    (("first_stage_model.decoder.", "decoder.up.0.block.0."), "a Stable Diffusion style VAE"),
    (("layers.0.self_attn.q_proj.weight",), "an LLM text encoder"),
    (("encoder.block.0.layer.0.",), "a T5 text encoder"),
    (("text_model.encoder.layers.0.",), "a CLIP text encoder"),
    (("txt_norm.weight",), "a Qwen-Image transformer"),
    (("blocks.0.self_attn.",), "a Wan video transformer"),
)


def describe_contents(keys: Iterable[str]) -> str:
    """A short guess of what a file holds, from its key names, for error messages."""
    keys = list(keys)
    for needles, what in _SIGNATURES:
        if any(n in k for k in keys for n in needles):
            return what
    return f"an unknown model (first keys: {keys[:3]})"


def wrong_file(path, part: str, keys: Iterable[str]) -> UserInputError:
    """The error for a file that is not the Qwen-Image `part` it was chosen as."""
    return UserInputError(
        f"{part} file {path} is not a Qwen-Image {part}: it looks like {describe_contents(keys)}. "
        f"Choose {WHAT_TO_CHOOSE[part]}."
    )
