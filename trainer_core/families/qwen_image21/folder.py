"""Qwen-Image 2.1 from a diffusers folder (transformer/, vae/, text_encoder/, processor/, scheduler/), optionally
with the transformer, the text encoder and the VAE from ComfyUI's single files instead (files.py, text_file.py,
vae_file.py).

The text encoder is transformers' `Qwen3VLForConditionalGeneration`, the VAE diffusers' `AutoencoderKLQwenImage21`,
both read with `from_pretrained`. The processor is built from the folder's tokenizer (`processor/`, else
`tokenizer/`) and the encoder's vision config (processor.py: no video processor, no torchvision); the
scheduler settings from `scheduler/scheduler_config.json`, else the published ones (tiny.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...core.errors import UserInputError
from ...models.components import QwenImageComponents
from ...models.float8 import store_block_linears
from ..registry import get_family
from .conditioning import NAME

# Only the folder's own files, only safetensors (no pickles, never the network).
local = dict(use_safetensors=True, local_files_only=True)  # noqa: N816 (test_security reads **local)


def _tokenizer(root: Path):
    from transformers import AutoTokenizer

    for sub in ("processor", "tokenizer"):
        if (root / sub / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(str(root / sub), local_files_only=True)
    raise UserInputError(f"{root} has no processor/ or tokenizer/ folder with tokenizer_config.json: is it a diffusers "
                         "Qwen-Image 2.1 folder?")


def load_qwen_image21_folder(folder: str | Path, transformer_file: str | Path | None = None, storage: str = "float8",
                             compute_dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                             text_encoder_file: str | Path | None = None,
                             vae_file: str | Path | None = None, text_encoder_fp8: str = "dequantize") -> QwenImageComponents:
    """The model set of a diffusers folder; block Linears stored as `storage`, the rest in `compute_dtype`. The
    transformer, the text encoder and the VAE may come from ComfyUI's single files instead (files.py,
    text_file.py, vae_file.py); `text_encoder_fp8` ("keep" or "dequantize", decided) says what the encoder file's
    one-byte weights become (text_file.py).

    With the transformer from its file the set is lazy, as Qwen-Image's from files (models/components.py): here
    only headers, configs and the tokenizer are read; the text encoder (and the VAE from its file) load when the
    cache misses, the transformer streams in at Init Trainer. From the folder alone every part is loaded."""
    root = Path(folder).expanduser()
    for part in (("vae",) if vae_file is None else ()) + (("text_encoder",) if text_encoder_file is None else ()):
        if not (root / part / "config.json").is_file():
            raise UserInputError(f"{root / part} has no config.json: is {root} a diffusers Qwen-Image 2.1 folder?")
    device = torch.device(device)
    if transformer_file is None:
        return _loaded(root, storage, compute_dtype, device, text_encoder_file, vae_file, text_encoder_fp8)
    return _lazy(root, transformer_file, storage, compute_dtype, device, text_encoder_file, vae_file, text_encoder_fp8)


def _scheduler_config(root: Path) -> dict:
    from .tiny import QWEN_IMAGE21_SCHEDULER_CONFIG

    scheduler_file = root / "scheduler" / "scheduler_config.json"
    return json.loads(scheduler_file.read_text()) if scheduler_file.is_file() else dict(QWEN_IMAGE21_SCHEDULER_CONFIG)


def _folder_vae(root: Path, compute_dtype: torch.dtype, device: torch.device):
    from diffusers import AutoencoderKLQwenImage21

    vae = AutoencoderKLQwenImage21.from_pretrained(str(root / "vae"), torch_dtype=compute_dtype, **local)
    return vae.to(device).requires_grad_(False).eval()


def _text_encoder_reader(root: Path, text_encoder_file, compute_dtype: torch.dtype, fp8: str = "dequantize"):
    """(its config, a function of a placement (models.text_encoder_file.Placement, or None) that reads it, the files it
    is read from): from its file, else the folder (read whole into host memory, then placed)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from .text_file import load_qwen3_vl_file, qwen3_vl_file_config

    if text_encoder_file is not None:
        return (Qwen3VLConfig(**qwen3_vl_file_config(text_encoder_file)),
                lambda placement: load_qwen3_vl_file(text_encoder_file, compute_dtype, fp8, placement),
                [Path(text_encoder_file)])
    folder = root / "text_encoder"

    def read_folder(placement):
        encoder = Qwen3VLForConditionalGeneration.from_pretrained(str(folder), torch_dtype=compute_dtype, **local)
        if placement is not None:
            placement(encoder)[1](encoder)  # from_pretrained reads to the CPU: only the placing is left
        return encoder

    return Qwen3VLConfig.from_pretrained(str(folder), local_files_only=True), read_folder, sorted(folder.glob("*.safetensors"))


def _loaded(root: Path, storage: str, compute_dtype: torch.dtype, device: torch.device, text_encoder_file,
            vae_file, text_encoder_fp8: str) -> QwenImageComponents:
    from diffusers import QwenImage21Transformer2DModel

    from .processor import build_processor

    transformer = QwenImage21Transformer2DModel.from_pretrained(str(root / "transformer"), torch_dtype=compute_dtype,
                                                                **local)
    transformer.requires_grad_(False).eval()
    store_block_linears(transformer, storage)
    if vae_file is not None:
        from .vae_file import QwenImage21VaeFile

        vae = QwenImage21VaeFile(vae_file, compute_dtype)().to(device)
    else:
        vae = _folder_vae(root, compute_dtype, device)
    _, read, _ = _text_encoder_reader(root, text_encoder_file, compute_dtype, text_encoder_fp8)

    def load_text_encoder():
        encoder = read(components.text_encoder_placement)
        return encoder.requires_grad_(False).eval(), build_processor(_tokenizer(root), encoder.config.vision_config)

    text_encoder = read(None).requires_grad_(False).eval()  # a folder's model set is loaded whole, at once
    processor = build_processor(_tokenizer(root), text_encoder.config.vision_config)
    components = QwenImageComponents(
        transformer=transformer, vae=vae, text_encoder=text_encoder.to(device), tokenizer=processor,
        scheduler_config=_scheduler_config(root), compute_dtype=compute_dtype, device=device, name=root.name,
        storage=storage, family=get_family(NAME), text_encoder_loader=load_text_encoder,
        processor_loader=lambda: processor,
    )
    return components


def _lazy(root: Path, transformer_file, storage: str, compute_dtype: torch.dtype, device: torch.device,
          text_encoder_file, vae_file, text_encoder_fp8: str) -> QwenImageComponents:
    import hashlib

    from ...models.components import vocabulary_bytes
    from ...models.file_identity import combined_identity, file_identity
    from ...planner.device import CachingPlacement
    from .files import QwenImage21TransformerFile
    from .processor import build_processor

    source = QwenImage21TransformerFile(transformer_file, storage, compute_dtype)  # its header: checked now
    config, read, encoder_files = _text_encoder_reader(root, text_encoder_file, compute_dtype, text_encoder_fp8)
    processor = build_processor(_tokenizer(root), config.vision_config)
    dtype = str(compute_dtype).removeprefix("torch.")
    identities = {
        "transformer": combined_identity(file_identity(transformer_file), "qwen-image-2.1"),
        "text_encoder": combined_identity(*map(file_identity, encoder_files), dtype,
                                          *(("fp8=keep",) if text_encoder_fp8 == "keep" and text_encoder_file else ()),
                                          hashlib.sha256(vocabulary_bytes(processor)).hexdigest()),
    }
    vae, vae_loader = None, None
    if vae_file is not None:
        from .vae_file import QwenImage21VaeFile

        vae_loader = QwenImage21VaeFile(vae_file, compute_dtype)  # its header: checked now; read when needed
        identities["vae"] = combined_identity(file_identity(vae_file), dtype)
    else:
        vae = _folder_vae(root, compute_dtype, device)  # small; parked on the CPU after caching

    def load_text_encoder():
        return read(components.text_encoder_placement).requires_grad_(False).eval(), processor

    components = QwenImageComponents(
        transformer=None, vae=vae, text_encoder=None, tokenizer=None, scheduler_config=_scheduler_config(root),
        compute_dtype=compute_dtype, device=device, name=Path(transformer_file).stem, storage=storage,
        family=get_family(NAME), text_encoder_loader=load_text_encoder, processor_loader=lambda: processor,
        vae_loader=vae_loader, transformer_source=source, _fingerprints=identities,
    )
    components.text_encoder_placement = CachingPlacement(components, one_byte=text_encoder_fp8 == "keep"
                                                         and text_encoder_file is not None)
    return components


def save_qwen_image21_folder(components: QwenImageComponents, folder: str | Path) -> Path:
    """A model set as a diffusers folder `load_qwen_image21_folder` (and diffusers) read."""
    from ...models.float8 import dequantized_state_dict

    root = Path(folder)
    transformer = components.transformer
    plain = type(transformer).from_config(transformer.config)  # float8 storage written as its values
    plain.load_state_dict(dequantized_state_dict(transformer))
    plain.save_pretrained(str(root / "transformer"))
    components.vae.save_pretrained(str(root / "vae"))
    components.text_encoder.save_pretrained(str(root / "text_encoder"))
    components.tokenizer.tokenizer.save_pretrained(str(root / "processor"))
    (root / "scheduler").mkdir(parents=True, exist_ok=True)
    (root / "scheduler" / "scheduler_config.json").write_text(
        json.dumps({"_class_name": "FlowMatchEulerDiscreteScheduler", **components.scheduler_config}, indent=2))
    (root / "model_index.json").write_text(json.dumps({"_class_name": "QwenImage21Pipeline"}, indent=2))
    return root
