"""Qwen-Image from a diffusers-format directory (transformer/, vae/, text_encoder/, tokenizer/, scheduler/).

The transformer is streamed tensor by tensor onto an empty model (see `streaming.py`), so a bf16
checkpoint is stored as float8 without ever holding a second full copy.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..core.errors import UserInputError
from .components import QwenImageComponents
from .float8 import dequantized_weight, frozen_block_linears
from .safetensors_file import SafetensorsFile
from .scheduler import QWEN_IMAGE_SCHEDULER_CONFIG
from .streaming import empty_transformer, stream_into
from .tokenizer import load_tokenizer

PARTS = ("transformer", "vae", "text_encoder", "tokenizer")


def _weight_files(root: Path, part: str) -> list[SafetensorsFile]:
    """The part's .safetensors files, each opened (header checked: a truncated or damaged file is refused
    by name before anything is loaded) and holding floating-point weights only."""
    files = [SafetensorsFile(f, f"{part} weights") for f in sorted((root / part).glob("*.safetensors"))]
    if not files:
        raise UserInputError(f"{root / part} holds no .safetensors files: is {root} a diffusers Qwen-Image folder? "
                             "(Only .safetensors weights are read, never .bin.)")
    for file in files:
        file.require_floating(file.keys)
    return files


def _safetensors_tensors(files: list[SafetensorsFile]):
    for file in files:
        for name in file.keys:
            yield name, file.tensor(name)


def _json_object(path: Path, what: str) -> dict:
    """A JSON object from `path`; a `UserInputError` naming the file when it is missing or not one."""
    if not path.is_file():
        raise UserInputError(f"model folder {path.parents[1]} lacks {path.relative_to(path.parents[1])} ({what}): "
                             "copy the complete diffusers Qwen-Image folder again.")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserInputError(f"{path} ({what}) is not valid JSON ({e}): copy it again from the model.") from e
    if not isinstance(data, dict):
        raise UserInputError(f"{path} ({what}) is not a JSON object: copy it again from the model.")
    return data


def _check_text_encoder_config(root: Path, files: list[SafetensorsFile]) -> None:
    """The text encoder's config must describe the widths its weights have. transformers builds the model from
    the config before it reads the weights: a config of the 7B model beside small weights (or a missing
    config, for which it assumes the 7B defaults) would allocate tens of GB before failing."""
    config_file = root / "text_encoder" / "config.json"
    config = _json_object(config_file, "the text encoder's config")
    # (section, weight, config names of its leading dims, whether older configs keep them at the top level)
    checks = [("text_config", "embed_tokens.weight", ("vocab_size", "hidden_size"), True),
              ("vision_config", "visual.patch_embed.proj.weight", ("hidden_size",), False)]
    for section, suffix, names, top_level in checks:
        nested = config.get(section) if isinstance(config.get(section), dict) else {}
        outer = config if top_level else {}
        expected = {i: nested.get(n, outer.get(n)) for i, n in enumerate(names)}
        found = [(k, f.shapes[k]) for f in files for k in f.keys if k.endswith(suffix)]
        if found and any(v is not None and found[0][1][i] != v for i, v in expected.items()):
            raise UserInputError(
                f"{config_file} says {dict(zip(names, expected.values()))}, but the weights' {found[0][0]} is "
                f"{found[0][1]}: the config and the weights are of different models. Copy the text_encoder folder "
                "again from the diffusers Qwen-Image model.")


def _load_part(root: Path, part: str, load):
    """`load()` a vae / text_encoder / tokenizer part, its library's errors turned into one naming the folder."""
    from safetensors import SafetensorError

    try:
        return load()
    except torch.OutOfMemoryError:
        raise
    except (OSError, ValueError, TypeError, KeyError, RuntimeError, SafetensorError) as e:
        raise UserInputError(f"model folder {root}: {part}/ could not be loaded ({type(e).__name__}: "
                             f"{str(e)[:300]}). Copy that subfolder again from the diffusers Qwen-Image model.") from e


def load_diffusers_dir(
    path: str | Path,
    storage: str = "float8",
    compute_dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    *,
    family,
) -> QwenImageComponents:
    """Load all parts from `path`, a model set of `family`. The transformer stays on the CPU; the trainer places its
    blocks."""
    from diffusers import AutoencoderKLQwenImage
    from transformers import Qwen2_5_VLForConditionalGeneration

    root = Path(path)
    missing = [p for p in PARTS if not (root / p).is_dir()]
    if not root.is_dir() or missing:
        raise UserInputError(
            f"model folder {root} is not a diffusers Qwen-Image folder (missing: {missing or 'the folder'}). "
            "It needs transformer/, vae/, text_encoder/ and tokenizer/ subfolders."
        )
    config_file = root / "transformer" / "config.json"
    config = _json_object(config_file, "the transformer's config")
    weights = {part: _weight_files(root, part) for part in ("transformer", "vae", "text_encoder")}
    _json_object(root / "vae" / "config.json", "the VAE's config")
    _check_text_encoder_config(root, weights["text_encoder"])
    try:
        transformer = empty_transformer(config)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise UserInputError(f"{config_file} does not describe a Qwen-Image transformer ({type(e).__name__}: {e}). "
                             "Copy it again from the model.") from e
    stream_into(transformer, _safetensors_tensors(weights["transformer"]), storage, compute_dtype,
                source=str(root / "transformer"))
    transformer.eval()
    device = torch.device(device)
    # safetensors only (never unpickle a user's .bin), and never reach for the network.
    local = dict(use_safetensors=True, local_files_only=True)
    vae = _load_part(root, "vae", lambda: AutoencoderKLQwenImage.from_pretrained(
        root / "vae", torch_dtype=compute_dtype, **local)).to(device).eval()
    vae.requires_grad_(False)

    def load_text_encoder():
        text_encoder = _load_part(root, "text_encoder", lambda: Qwen2_5_VLForConditionalGeneration.from_pretrained(
            root / "text_encoder", dtype=compute_dtype, **local))
        # The same checks as for single files: the chat template's tokens, and an embedding row per token.
        tokenizer = load_tokenizer(root / "tokenizer", root / "text_encoder",
                                   text_encoder.get_input_embeddings().weight.shape[0])
        return text_encoder.requires_grad_(False).eval(), tokenizer

    text_encoder, tokenizer = load_text_encoder()
    scheduler_file = root / "scheduler" / "scheduler_config.json"
    scheduler = (_json_object(scheduler_file, "the scheduler's config") if scheduler_file.is_file()
                 else dict(QWEN_IMAGE_SCHEDULER_CONFIG))
    return QwenImageComponents(
        transformer=transformer, vae=vae, text_encoder=text_encoder.to(device), tokenizer=tokenizer,
        scheduler_config=scheduler, compute_dtype=compute_dtype, device=device, family=family, name=root.name,
        storage=storage, text_encoder_loader=load_text_encoder,
    )


def save_diffusers_dir(components: QwenImageComponents, path: str | Path) -> Path:
    """Write `components` as a diffusers folder (weights dequantised to the compute dtype)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    transformer = components.transformer
    state = transformer.state_dict()
    for name, linear in frozen_block_linears(transformer):
        state[f"{name}.weight"] = dequantized_weight(linear, components.compute_dtype).contiguous()
        state.pop(f"{name}.weight_scale", None)
    (root / "transformer").mkdir(exist_ok=True)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()},
              str(root / "transformer" / "diffusion_pytorch_model.safetensors"))
    (root / "transformer" / "config.json").write_text(json.dumps(dict(transformer.config), indent=2))
    components.vae.save_pretrained(root / "vae")
    components.text_encoder.save_pretrained(root / "text_encoder")
    components.tokenizer.save_pretrained(root / "tokenizer")
    (root / "scheduler").mkdir(exist_ok=True)
    (root / "scheduler" / "scheduler_config.json").write_text(
        json.dumps({"_class_name": "FlowMatchEulerDiscreteScheduler", **components.scheduler_config}, indent=2))
    (root / "model_index.json").write_text(json.dumps({
        "_class_name": "QwenImagePipeline",
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "QwenImageTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLQwenImage"],
    }, indent=2))
    return root

