"""Qwen-Image 2.1's Qwen3-VL text encoder as one file, in ComfyUI's layout: reader and writer.

ComfyUI's 2.1 text encoder (comfy/text_encoders/qwen_image21.py, Comfy-Org/ComfyUI at 19d1def) is its
`comfy.text_encoders.qwen3vl` model with model_type qwen3vl_8b, whose state dict names are
    model.embed_tokens, model.layers.<i>.{self_attn.{q,k,v,o}_proj,q_norm,k_norm},mlp.{gate,up,down}_proj,
    input_layernorm,post_attention_layernorm}, model.norm, model.lm_head, visual.{patch_embed,pos_embed,
    blocks.<i>,merger,deepstack_merger_list.<i>}.*
(recorded from ComfyUI 0.33.0's identical qwen3vl.py in tests/data/comfy_qwen3vl_8b_keys.json by
tests/host/comfy_qwen3vl_probe.py). transformers' `Qwen3VLForConditionalGeneration` names the same tensors
`model.language_model.*`, `model.visual.*` and `lm_head`; ComfyUI reads files in either layout (it replaces those
prefixes), and so do we. bf16/fp16/fp32 files, per-tensor float8 (ComfyUI's `scale_weight`, or 0.33+'s
`weight_scale` layers: `layouts.split_scaled_fp8`) and ComfyUI's int8 layers (`qwen3vl_8b_int8_convrot`, the file
ComfyUI's 2.1 templates download: models/int8_convrot.py). `fp8` as for Qwen-Image's encoder
(models/text_encoder_file.py): "dequantize" to the compute dtype while loading, or "keep" the decoder's and the
vision tower's one-byte Linear weights as stored (9.4 GB instead of 17.5 GB for the 8B), computed through
float8/storage.py's frozen path; embedding tables are dequantized either way.

What is loaded: language model and vision tower (a reference image will need it); `lm_head` is replaced by an
identity, as the pipeline reads hidden states, never logits (captioning, trainer_core/captions, asks for the real
head with `head=True`: it generates words; training's path is unchanged). Config: the JSON beside the file (a test
model), else `arch.QWEN3_VL_8B_CONFIG` when the shapes are that model's; anything else is refused.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ...core.errors import UserInputError
from ...models.layouts import int8_weights, refuse_nonfinite_scales, split_scaled_fp8
from .arch import QWEN3_VL_8B_CONFIG
from ...models.safetensors_file import SafetensorsFile
from ...models.streaming import assign_frozen_linear_weight, assign_parameter, dequantize, fill_empty
from ...models.text_encoder_file import ONE_BYTE_DTYPES, Placement, check_fp8_mode, head_tensors, tie_head

# ours -> ComfyUI's, by prefix (longest first when reading back)
PREFIXES = (("model.language_model.", "model."), ("model.visual.", "visual."), ("lm_head.", "model.lm_head."))
_HINT = ("Choose Qwen-Image 2.1's Qwen3-VL-8B text encoder file (qwen3vl_8b_int8_convrot, bf16 or per-tensor float8), "
         "or set text_encoder to (not used) to read it from the diffusers folder.")


def comfyui_name(ours: str) -> str:
    for mine, theirs in PREFIXES:
        if ours.startswith(mine):
            return theirs + ours[len(mine):]
    raise ValueError(f"{ours} is not a Qwen3-VL tensor name")


def our_name(name: str, head: bool = False) -> str | None:
    """transformers' name of a file tensor in either layout; None for lm_head (not loaded) unless `head` (generating
    words: captioning)."""
    for theirs in ("lm_head.", "model.lm_head."):
        if name.startswith(theirs):
            return "lm_head." + name[len(theirs):] if head else None
    if name.startswith(("model.language_model.", "model.visual.")):
        return name
    if name.startswith("visual."):
        return "model." + name
    if name.startswith("model."):
        return "model.language_model." + name[len("model."):]
    return name  # unknown: fill_empty names it


def _config(shapes: dict[str, tuple[int, ...]], sidecar: dict | None, source: str) -> dict:
    if sidecar is not None:
        return sidecar
    text, vision = QWEN3_VL_8B_CONFIG["text_config"], QWEN3_VL_8B_CONFIG["vision_config"]
    layers = 1 + max((int(n.split(".")[3]) for n in shapes if n.startswith("model.language_model.layers.")), default=-1)
    blocks = 1 + max((int(n.split(".")[3]) for n in shapes if n.startswith("model.visual.blocks.")), default=-1)
    hidden = shapes.get("model.language_model.embed_tokens.weight", (0, 0))[1]
    if (hidden, layers, blocks) != (text["hidden_size"], text["num_hidden_layers"], vision["depth"]):
        raise UserInputError(f"text encoder file {source} is not Qwen3-VL-8B (found width {hidden}, {layers} layers, "
                             f"{blocks} vision blocks; 2.1's has {text['hidden_size']}, {text['num_hidden_layers']}, "
                             f"{vision['depth']}) and no config JSON beside it. {_HINT}")
    return QWEN3_VL_8B_CONFIG


def empty_qwen3_vl(config: dict, head: bool = False) -> nn.Module:
    """`Qwen3VLForConditionalGeneration` on the meta device with an identity lm_head (unless `head`: the real one)."""
    from accelerate import init_empty_weights
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    with init_empty_weights(include_buffers=False):  # buffers (RoPE) real: nothing stays on the meta device
        model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**config))
    if not head:
        model.lm_head = nn.Identity()  # "logits" are then the last hidden state, at no cost
    return model


def qwen3_vl_file_config(path: str | Path) -> dict:
    """The file's Qwen3-VL config (`Qwen3VLConfig` keys) from its header and the JSON beside it: no weight read."""
    file = SafetensorsFile(path, "text encoder")
    names, _ = split_scaled_fp8({k: k for k in file.keys}, file)
    shapes = {mine: file.shapes[key] for key in names if (mine := our_name(key)) is not None}
    return _config(shapes, file.sidecar_config(), str(file.path))


def load_qwen3_vl_file(path: str | Path, compute_dtype: torch.dtype = torch.bfloat16,
                       fp8: str = "dequantize", placement: Placement | None = None, head: bool = False) -> nn.Module:
    """The text encoder of the file, frozen, in eval mode: on the CPU, or where `placement` puts it
    (models.text_encoder_file.Placement); one-byte Linear weights kept when `fp8` is "keep" (see the module
    docstring); `head`: with the real lm_head (or the tied embeddings), for generating words."""
    check_fp8_mode(fp8)
    file = SafetensorsFile(path, "text encoder")
    everything = {k: k for k in file.keys}
    names, scale_keys = split_scaled_fp8(everything, file)
    ours = {mine: key for key in names if (mine := our_name(key, head)) is not None}
    scale_for = {mine: key for n, key in scale_keys.items() if (mine := our_name(n, head)) is not None}
    int8 = {mine: group for n, group in int8_weights(file, everything).items()
            if (mine := our_name(n, head)) is not None}
    file.require_floating([*ours.values(), *scale_for.values()], int8_ok=[ours[n] for n in int8 if n in ours])
    scales = {name: file.tensor(key) for name, key in scale_for.items()}
    refuse_nonfinite_scales(file, {scale_for[n]: s for n, s in scales.items()})
    config = _config({n: file.shapes[k] for n, k in ours.items()}, file.sidecar_config(), str(file.path))
    model = empty_qwen3_vl(config, head)
    if head:
        ours = head_tensors(ours, model.config, str(file.path), _HINT)
    linears = {name for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    device_for, finish = placement(model) if placement is not None else (None, None)

    def assign(module: nn.Module, leaf: str, name: str, tensor: torch.Tensor) -> None:
        scale, group = scales.get(name), int8.get(name, 0)
        home = device_for(name) if device_for is not None else tensor.device
        if fp8 == "keep" and tensor.dtype in ONE_BYTE_DTYPES and leaf == "weight" and name[: -len(".weight")] in linears:
            assign_frozen_linear_weight(module, tensor.to(home), None if scale is None else scale.to(home), group)
        else:
            assign_parameter(module, leaf, dequantize(tensor, scale, group).to(home, compute_dtype))

    fill_empty(model, ((n, file.tensor(k)) for n, k in ours.items()), assign, source=f"text encoder file {file.path}",
               hint=_HINT, int8_ok=int8)
    if head:
        tie_head(model)
    if finish is not None:
        finish(model)
    return model.requires_grad_(False).eval()


def comfyui_text_encoder_tensors(encoder: nn.Module, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """A Qwen3-VL text encoder as ComfyUI's file holds it (lm_head included, as ComfyUI's module has one)."""
    return {comfyui_name(n): t.to(dtype).contiguous() for n, t in encoder.state_dict().items()}
