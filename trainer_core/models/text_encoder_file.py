"""The Qwen2.5-VL text encoder as one file (ComfyUI's text_encoders/qwen_2.5_vl_7b*.safetensors).

ComfyUI's layout (comfy/text_encoders/llama.py `Qwen25_7BVLI`, read by comfy/sd.py): the language model
under HF's older names `model.embed_tokens`, `model.layers.<i>.{self_attn,mlp,...}`, `model.norm`, the
vision tower under `visual.*`, and `lm_head.weight`, which ComfyUI does not use. transformers 5's
`Qwen2_5_VLForConditionalGeneration` keeps the language model under `model.language_model.*` and the
vision tower under `model.visual.*`; a file already in that layout is read as well.
The `_fp8_scaled` file holds every Linear weight in float8_e4m3fn with a per-tensor fp32
`<module>.scale_weight` (real weight = float8 * scale) and a `scaled_fp8` marker (see layouts.py).

What is loaded: the language model only. Qwen-Image encodes text, so the vision tower is left out
(text-only forward never touches it) and `lm_head` is replaced by an identity: Qwen-Image reads the
last hidden state, never logits, and the real head is a 1 GB (152064 x 3584) matmul per token.
Nothing stays on the meta device, so `.to(device)` works.
Captioning (trainer_core/captions) generates words with the same file: `vision=True, head=True` keep the vision tower
and the real `lm_head` (or, in a file without one whose config ties it, the embedding table as the head); training's
path (both False) is unchanged.

fp8 and int8 files, two ways (`fp8`): "dequantize" multiplies each weight by its scale (and rotates a ConvRot int8
weight back, models/int8_convrot.py) while loading, one tensor at a time, into `compute_dtype`; "keep" keeps the
one-byte weights (half of bf16's memory) with their scale as `weight_scale` and computes through float8/storage.py's
`FrozenLinearFunction` (upcast per call). An int8 embedding table is dequantized either way.
The Load settings' "auto" is decided above this layer, for the device the encoder will run on
(`planner.device.resolve_text_encoder_fp8`, which the families' loaders call); here it is refused.

Config: the JSON beside the file when there is one (a test model), else `qwen_arch.QWEN25_VL_7B_CONFIG` when
the tensor shapes are the 7B's; anything else is refused with a message that names what was found.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..core.config import TEXT_ENCODER_FP8_MODES
from ..core.errors import UserInputError
from .float8 import dequantized_state_dict, quantize_per_tensor
from .layouts import (
    SCALE_WEIGHT,
    SCALED_FP8_MARKER,
    detect_layout,
    int8_weights,
    refuse_nonfinite_scales,
    split_scaled_fp8,
    strip_prefix,
)
from .qwen_arch import QWEN25_VL_7B_CONFIG
from .safetensors_file import SafetensorsFile
from .streaming import assign_frozen_linear_weight, assign_parameter, dequantize, fill_empty

TEXT_ENCODER_FILE_FORMATS = ("bf16", "fp8_scaled")
ONE_BYTE_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)  # kept as stored under fp8 = "keep"

_LM = "model.language_model."
LM_HEAD = "lm_head."
EMBEDDINGS = _LM + "embed_tokens.weight"


def our_name(name: str, vision: bool = False, head: bool = False) -> str | None:
    """transformers 5 name of a file tensor (names without file prefix); None for parts not loaded. `vision`:
    the vision tower is loaded too (Qwen-Image-Edit sees its control images through it); `head`: the real `lm_head`
    too (captioning generates words)."""
    if head and name.startswith(LM_HEAD):
        return name
    if name.startswith(_LM):
        return name
    if vision and name.startswith("visual."):
        return "model." + name
    if vision and name.startswith("model.visual."):
        return name
    if name.startswith(("visual.", "model.visual.", "lm_head.")):
        return None
    if name.startswith("model."):
        return _LM + name[len("model."):]
    return name  # unknown: reported as such by fill_empty


def comfyui_name(name: str) -> str:
    """ComfyUI's name of a transformers 5 `Qwen2_5_VLForConditionalGeneration` tensor."""
    if name.startswith(_LM):
        return "model." + name[len(_LM):]
    if name.startswith("model.visual."):
        return name[len("model."):]
    return name


def _dims(shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """What the shapes say about a text model (names in our layout)."""
    layers = {int(n[len(_LM) + len("layers."):].split(".")[0]) for n in shapes if n.startswith(_LM + "layers.")}
    vocab, hidden = shapes[_LM + "embed_tokens.weight"]
    return dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=len(layers),
                intermediate_size=shapes[_LM + "layers.0.mlp.gate_proj.weight"][0])


def text_encoder_config(shapes: dict[str, tuple[int, ...]], sidecar: dict | None, source: str) -> dict:
    if sidecar is not None:
        return sidecar
    try:
        found = _dims(shapes)
    except KeyError as e:
        raise UserInputError(f"text encoder file {source} lacks {e}: it is not a complete Qwen2.5-VL text "
                             "encoder. Choose qwen_2.5_vl_7b_fp8_scaled.safetensors or qwen_2.5_vl_7b.safetensors.") from e
    expected = {k: QWEN25_VL_7B_CONFIG["text_config"][k] for k in found}
    if found != expected:
        raise UserInputError(
            f"text encoder file {source} is a language model with {found}, but Qwen-Image uses Qwen2.5-VL 7B "
            f"({expected}). Choose qwen_2.5_vl_7b_fp8_scaled.safetensors or qwen_2.5_vl_7b.safetensors "
            "(a smaller test model needs its config JSON beside it)."
        )
    return QWEN25_VL_7B_CONFIG


def empty_text_encoder(config: dict, vision: bool = False, head: bool = False) -> nn.Module:
    """`Qwen2_5_VLForConditionalGeneration` on the meta device, without vision tower (unless `vision`), identity
    lm_head (unless `head`: the real one, for generating words)."""
    from accelerate import init_empty_weights
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    with init_empty_weights(include_buffers=False):
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig.from_dict(config))
    if not vision:
        model.model.visual = None  # only image/video inputs reach it
    if not head:
        model.lm_head = nn.Identity()  # "logits" are then the last hidden state, at no cost
    return model


def ties_embeddings(config) -> bool:
    """Whether a transformers VL config says its lm_head is its embedding table (the small Qwen-VL models do; the 7B
    and 8B do not). transformers ties them when it loads a checkpoint; a model built on the meta device is not yet."""
    return bool(getattr(config, "tie_word_embeddings", False)
                or getattr(config.get_text_config(), "tie_word_embeddings", False))


def head_tensors(names: dict[str, str], config, source: str, hint: str, head: str = LM_HEAD + "weight",
                 embeddings: str = EMBEDDINGS) -> dict[str, str]:
    """`names` (our name -> file key) with the generating head: the file's own, else the embedding table's key under
    the head's name where `config` ties them (the model then shares one tensor, `tie_head`); a file without a head
    whose config does not tie it is refused: generating words needs it."""
    if head in names:
        return names
    if ties_embeddings(config) and embeddings in names:
        return {**names, head: names[embeddings]}
    raise UserInputError(f"text encoder file {source} has no lm_head (the language model's output layer, which turns "
                         f"its hidden states into words), and its config does not tie it to the embeddings. {hint}")


def tie_head(model: nn.Module) -> None:
    """Share the embedding table as lm_head where the config ties them (one tensor, not a second copy)."""
    if ties_embeddings(model.config):
        model.lm_head.weight = model.get_input_embeddings().weight


# Where a text encoder's tensors go as a loader reads them, decided above the model loaders (planner.device's caching
# placement: the streamed layers' weights in host memory, the rest on the device): given the encoder built on the
# meta device, (name -> the device its tensor is read to, a function run on the filled encoder that places the rest and
# installs the streaming). A loader without one reads everything to the CPU.
Placement = Callable[[nn.Module], tuple[Callable[[str], torch.device], Callable[[nn.Module], None]]]


def check_fp8_mode(fp8: str) -> None:
    """The loaders take a concrete mode: 'auto' depends on the device's free memory, which the planner knows."""
    if fp8 == "auto":
        raise UserInputError("text_encoder_fp8='auto' reached a model loader, which takes 'keep' or 'dequantize' only: "
                             "resolve it first with trainer_core.planner.resolve_text_encoder_fp8(mode, device) (the "
                             "loaders of trainer_core.families do), or pass 'dequantize'.")
    if fp8 not in TEXT_ENCODER_FP8_MODES:
        raise UserInputError(f"text_encoder_fp8={fp8!r} is not one of {list(TEXT_ENCODER_FP8_MODES)}.")


class TextEncoderFile:
    """A text encoder file whose header is read and checked at once; calling it reads the weights (a new model
    each call, see the module docstring)."""

    def __init__(self, path: str | Path, compute_dtype: torch.dtype = torch.bfloat16, fp8: str = "dequantize",
                 vision: bool = False, head: bool = False):
        """`vision`: with the vision tower (`visual.*`), for Qwen-Image-Edit; `head`: with the real lm_head, for
        generating words (captioning: `head_tensors`)."""
        check_fp8_mode(fp8)
        self.compute_dtype, self.fp8, self.vision, self.head = compute_dtype, fp8, vision, head
        self.file = file = SafetensorsFile(path, "text encoder")
        _, prefix = detect_layout(file.path, "text encoder", file.keys)
        stripped = strip_prefix(file.keys, prefix)
        file_names, scale_keys = split_scaled_fp8(stripped, file)
        self.names = {ours: key for name, key in file_names.items()
                      if (ours := our_name(name, vision, head)) is not None}
        self.int8 = {ours: group for name, group in int8_weights(file, stripped).items()
                     if (ours := our_name(name, vision, head)) is not None}  # weight -> ConvRot group (0: none)
        if vision and not any(n.startswith("model.visual.") for n in self.names):
            raise UserInputError(f"text encoder file {file.path} has no vision tower (visual.*), which Qwen-Image-Edit needs "
                                 "to see its control images. Choose qwen_2.5_vl_7b_fp8_scaled.safetensors (it has one).")
        self.scale_keys = {ours: key for name, key in scale_keys.items()
                           if (ours := our_name(name, vision, head)) is not None}
        file.require_floating([*self.names.values(), *self.scale_keys.values()],
                              int8_ok=[self.names[n] for n in self.int8 if n in self.names])
        shapes = {n: file.shapes[k] for n, k in self.names.items() if not n.startswith(LM_HEAD)}
        self.config = text_encoder_config(shapes, file.sidecar_config(), str(file.path))
        # One fp32 scalar per Linear (a few KB): read and checked now, so damage shows when the file is chosen.
        self.scales = {ours: file.tensor(key) for ours, key in self.scale_keys.items()}
        refuse_nonfinite_scales(file, {self.scale_keys[n]: s for n, s in self.scales.items()})

    def __call__(self, placement: Placement | None = None) -> nn.Module:
        """The text encoder, frozen, in eval mode: on the CPU, or placed by `placement` (see `Placement`)."""
        file, fp8, scales, int8 = self.file, self.fp8, self.scales, self.int8
        model = empty_text_encoder(self.config, self.vision, self.head)
        names = self.names if not self.head else head_tensors(
            self.names, model.config, str(file.path), "Choose ComfyUI's qwen_2.5_vl_7b_fp8_scaled.safetensors or "
            "qwen_2.5_vl_7b.safetensors: they carry it.")
        device_for, finish = placement(model) if placement is not None else (None, None)
        linears = {name for name, m in model.named_modules() if isinstance(m, nn.Linear)}

        def assign(module: nn.Module, leaf: str, name: str, tensor: torch.Tensor) -> None:
            scale = scales.get(name)
            home = device_for(name) if device_for is not None else tensor.device
            if fp8 == "keep" and tensor.dtype in ONE_BYTE_DTYPES and leaf == "weight" and name[: -len(".weight")] in linears:
                assign_frozen_linear_weight(module, tensor.to(home), None if scale is None else scale.to(home),
                                            int8.get(name, 0))
            else:
                assign_parameter(module, leaf, dequantize(tensor, scale, int8.get(name, 0)).to(home, self.compute_dtype))

        fill_empty(model, ((n, file.tensor(k)) for n, k in names.items()), assign,
                   source=f"text encoder file {file.path}",
                   hint="Choose qwen_2.5_vl_7b_fp8_scaled.safetensors or qwen_2.5_vl_7b.safetensors.", int8_ok=int8)
        if self.head:
            tie_head(model)
        if finish is not None:
            finish(model)
        return model.eval()


def load_text_encoder_file(
    path: str | Path, compute_dtype: torch.dtype = torch.bfloat16, fp8: str = "dequantize", vision: bool = False,
) -> nn.Module:
    """The text encoder from one file, on the CPU, frozen, in eval mode (see the module docstring). `vision`:
    with its vision tower (`visual.*`), for Qwen-Image-Edit."""
    return TextEncoderFile(path, compute_dtype, fp8, vision)()


def text_encoder_file_tensors(text_encoder: nn.Module, fmt: str = "bf16") -> dict[str, torch.Tensor]:
    """The encoder's tensors in ComfyUI's layout and `fmt` (one of TEXT_ENCODER_FILE_FORMATS).

    fp8_scaled: every Linear weight of the language model and the vision tower as float8 with its fp32
    `scale_weight` (ComfyUI builds all of them with its scaled-fp8 operations), plus the `scaled_fp8`
    marker; embeddings, norms, biases, the patch embedding and `lm_head` (not a ComfyUI Linear) in bf16.
    """
    if fmt not in TEXT_ENCODER_FILE_FORMATS:
        raise ValueError(f"unknown text encoder file format {fmt!r}; expected one of {TEXT_ENCODER_FILE_FORMATS}")
    linears = {name for name, m in text_encoder.named_modules() if isinstance(m, nn.Linear) and name != "lm_head"}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in dequantized_state_dict(text_encoder).items():
        module_name, _, leaf = name.rpartition(".")
        if fmt == "fp8_scaled" and module_name in linears and leaf == "weight":
            weight, scale = quantize_per_tensor(tensor)
            out[comfyui_name(name)] = weight
            out[comfyui_name(module_name) + SCALE_WEIGHT] = scale
        else:
            out[comfyui_name(name)] = tensor.to(torch.bfloat16)
    if fmt == "fp8_scaled":
        out[SCALED_FP8_MARKER] = torch.tensor([], dtype=torch.float8_e4m3fn)
    return {k: v.contiguous() for k, v in out.items()}
