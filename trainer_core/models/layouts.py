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


def split_scaled_fp8(names: dict[str, str], file=None) -> tuple[dict[str, str], dict[str, str]]:
    """Split (name -> file key) into (tensors, {weight name: file key of its scale}).

    A scale is `scale_weight` (ComfyUI's scaled-fp8 files) or `weight_scale` (ComfyUI 0.33+'s quantized
    layers). The `scaled_fp8` marker, input scales and `comfy_quant` entries are dropped (see the module
    docstring). Given the `SafetensorsFile`, layers quantized in a format other than per-tensor float8
    are refused with a `UserInputError` naming the format.
    """
    if file is not None:
        check_quantization_formats(file, {n: k for n, k in names.items() if n.endswith(COMFY_QUANT)})
    tensors, scales = {}, {}
    for name, key in names.items():
        if name in (SCALED_FP8_MARKER, EDIT_2511_MARKER) or name.endswith((SCALE_INPUT, INPUT_SCALE, COMFY_QUANT)):
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


def quantization_configs(file, names: dict[str, str] | None = None) -> dict[str, dict]:
    """Layer name -> its quantization config (the `comfy_quant` JSON, or the file's `_quantization_metadata` entry),
    for every quantized layer of `file`. `names` (name -> file key, e.g. without the file's prefix) names the layers;
    by default their file keys. A `UserInputError` when an entry cannot be read."""
    names = {k: k for k in file.keys} if names is None else names
    name_of = {key: name for name, key in names.items()}
    configs: dict[str, dict] = {}
    try:
        if QUANTIZATION_METADATA in file.metadata:
            for layer, conf in json.loads(file.metadata[QUANTIZATION_METADATA]).get("layers", {}).items():
                weight = name_of.get(f"{layer}.weight", f"{layer}.weight")
                configs[weight.removesuffix(".weight")] = dict(conf)
        for name, key in names.items():
            if name.endswith(COMFY_QUANT):
                raw = bytes(file.tensor(key).tolist()).rstrip(b"\0")
                configs[name[: -len(COMFY_QUANT)]] = dict(json.loads(raw.decode("utf-8")))
    except (ValueError, AttributeError, TypeError) as e:
        raise UserInputError(f"{file.part} file {file.path} has unreadable quantization entries ({e}): the file is "
                             "damaged or not one of ComfyUI's. Download it again, or choose the bf16 file.") from e
    return configs


def int8_weights(file, names: dict[str, str]) -> dict[str, int]:
    """Weight name -> the ConvRot group of its rotation (0: none) for every int8 layer of `file` (names as in
    `quantization_configs`). A bad group is refused."""
    out = {}
    for layer, conf in quantization_configs(file, names).items():
        if conf.get("format") == INT8_FORMAT:
            try:
                out[f"{layer}.weight"] = rotation_group(conf)
            except ValueError as e:
                raise UserInputError(f"{file.part} file {file.path}: layer {layer} {e}; ComfyUI writes powers of 4 "
                                     "(256). The file is damaged or not one of ComfyUI's.") from e
    return out


def check_quantization_formats(file, quant_keys: dict[str, str]) -> None:
    """Refuse a file whose quantized layers (`comfy_quant` entries or `_quantization_metadata`) are not all
    per-tensor float8 or int8 (READ_FORMATS): their scales mean something else, and reading them as one number per
    tensor or row would be wrong. The message names the format and the same model's files to choose instead."""
    formats = {layer: conf.get("format") for layer, conf in quantization_configs(file, quant_keys).items()}
    other = sorted({str(f) for f in formats.values() if f not in READ_FORMATS})
    if other:
        raise UserInputError(
            f"{file.part} file {file.path} has layers quantized as {other}, a format ComfyUI reads but this pack "
            f"does not (it reads bf16, float8 with one scale per weight or row, and int8 / int8 ConvRot). Choose "
            f"{same_model_files(file.path)}."
        )


# ComfyUI's file names end in the storage format (qwen_image_2.1_int8_convrot, qwen_image_edit_2511_fp8mixed).
_FORMAT_SUFFIX = re.compile(r"[._-](bf16|fp16|fp32|fp8_e4m3fn(_scaled)?|fp8_?mixed|fp8_scaled|int8_convrot|int8|nvfp4"
                            r"(_mixed)?|mxfp8(_mixed)?|w4a8(_\w+)?|w4a4(_\w+)?|int4(_\w+)?)$", re.IGNORECASE)


def same_model_files(path) -> str:
    """The names of the same model's files in the formats read here, when `path`'s name ends in a format (ComfyUI's
    convention), else the formats themselves."""
    from pathlib import Path

    stem = Path(path).stem
    match = _FORMAT_SUFFIX.search(stem)
    if match is None:
        return "its bf16, fp8 or int8 ConvRot file"
    base = stem[: match.start()]
    return " or ".join(f"{base}_{fmt}.safetensors" for fmt in ("int8_convrot", "fp8_e4m3fn", "bf16"))


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
