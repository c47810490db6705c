"""Qwen-Image from a diffusers-format directory (transformer/, vae/, text_encoder/, tokenizer/, scheduler/).

The transformer is streamed tensor by tensor onto an empty model (see `streaming.py`), so a bf16
checkpoint is stored as float8 without ever holding a second full copy.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import UserInputError
from .components import QwenImageComponents
from .float8 import dequantized_weight, frozen_block_linears
from .scheduler import QWEN_IMAGE_SCHEDULER_CONFIG
from .streaming import empty_transformer, stream_into

PARTS = ("transformer", "vae", "text_encoder", "tokenizer")


def _safetensors_tensors(folder: Path):
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UserInputError(f"{folder} holds no .safetensors files: is this a diffusers Qwen-Image folder?")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_diffusers_dir(
    path: str | Path,
    storage: str = "float8",
    compute_dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
) -> QwenImageComponents:
    """Load all parts from `path`. The transformer stays on the CPU; the trainer places its blocks."""
    from diffusers import AutoencoderKLQwenImage
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

    root = Path(path)
    missing = [p for p in PARTS if not (root / p).is_dir()]
    if not root.is_dir() or missing:
        raise UserInputError(
            f"model folder {root} is not a diffusers Qwen-Image folder (missing: {missing or 'the folder'}). "
            "It needs transformer/, vae/, text_encoder/ and tokenizer/ subfolders."
        )
    config = json.loads((root / "transformer" / "config.json").read_text())
    transformer = empty_transformer(config)
    stream_into(transformer, _safetensors_tensors(root / "transformer"), storage, compute_dtype,
                source=str(root / "transformer"))
    transformer.eval()
    device = torch.device(device)
    # safetensors only (never unpickle a user's .bin), and never reach for the network.
    local = dict(use_safetensors=True, local_files_only=True)
    vae = AutoencoderKLQwenImage.from_pretrained(root / "vae", torch_dtype=compute_dtype, **local).to(device).eval()
    vae.requires_grad_(False)

    def load_text_encoder():
        text_encoder = Qwen2_5_VLForConditionalGeneration.from_pretrained(root / "text_encoder", dtype=compute_dtype,
                                                                          **local)
        tokenizer = Qwen2Tokenizer.from_pretrained(root / "tokenizer", local_files_only=True)
        return text_encoder.requires_grad_(False).eval(), tokenizer

    text_encoder, tokenizer = load_text_encoder()
    scheduler_file = root / "scheduler" / "scheduler_config.json"
    scheduler = json.loads(scheduler_file.read_text()) if scheduler_file.is_file() else dict(QWEN_IMAGE_SCHEDULER_CONFIG)
    return QwenImageComponents(
        transformer=transformer, vae=vae, text_encoder=text_encoder.to(device), tokenizer=tokenizer,
        scheduler_config=scheduler, compute_dtype=compute_dtype, device=device, name=root.name, storage=storage,
        text_encoder_loader=load_text_encoder,
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

