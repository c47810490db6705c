"""The toy family's hooks (families/base.py): a text-to-image member with its own data convention, cache keys,
tiny model, real size for the plan and demo. Everything else (the training step, the previews' text-to-image
pipeline, the memory plan's transformer terms, LoRA files) the engine takes from the defaults and from its
transformer's architecture (Qwen-Image's MMDiT, declared by models/qwen_arch)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
from PIL import Image

from trainer_core.core.config import DatasetConfig
from trainer_core.data.cache import CACHE_VERSION
from trainer_core.families.base import CacheConditioning, DemoSpec, ModelFamily
from trainer_core.models.components import QwenImageComponents
from trainer_core.models.float8 import store_block_linears
from trainer_core.models.scheduler import QWEN_IMAGE_SCHEDULER_CONFIG
from trainer_core.models.text import encode_prompts
from trainer_core.models.tiny import TINY_TRANSFORMER, TINY_VAE, build_tiny_text_encoder
from trainer_core.planner.arch import arch_from_transformer

from .data import CAPTION_TABLE, load_caption_table_dataset

NAME = "toy-captions"
PREVIEW_PROMPT = "a toy block"
TRANSFORMER = {**TINY_TRANSFORMER, "num_layers": 3}  # its "real" size is its tiny one


class ToyConditioning(CacheConditioning):
    """Each prompt encoded alone, keyed by this family's name (its caches are its own)."""

    def __init__(self, components):
        self.components = components
        self.fingerprint = components.fingerprint("text_encoder")

    def text_key(self, prompt, sample):
        return hashlib.sha256("\x00".join((CACHE_VERSION, NAME, self.fingerprint, prompt)).encode()).hexdigest()[:32]

    def encode_prompts(self, jobs, write):
        for key, (prompt, _sample) in jobs.items():
            write({"embedding": encode_prompts(self.components.text_encoder, self.components.tokenizer, [prompt])[0]},
                  "text", key, f"prompt {prompt!r}")


def write_demo_folder(folder: Path) -> Path:
    """Four blocks of colour and a captions.json naming them."""
    folder.mkdir(parents=True, exist_ok=True)
    table = {}
    for n, colour in enumerate(("red", "green", "blue", "yellow")):
        Image.new("RGB", (64, 64), colour).save(folder / f"{n}.png")
        table[f"{n}.png"] = f"a {colour} toy block"
    (folder / "captions.json").write_text(json.dumps(table))
    return folder


class ToyCaptions(ModelFamily):
    name = NAME
    display_name = "Toy (captions from a table)"
    dataset_kinds = (CAPTION_TABLE,)

    def load_dataset(self, cfg, settings=None):
        return load_caption_table_dataset(cfg)

    def cache_conditioning(self, components, samples, settings):
        self.check_samples(samples)
        return ToyConditioning(components)

    def tiny_components(self, seed=0, storage="float32", compute_dtype=None, device="cpu"):
        dtype = compute_dtype or torch.float32
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            transformer = QwenImageTransformer2DModel(**TRANSFORMER).to(dtype)
            vae = AutoencoderKLQwenImage(**TINY_VAE).to(dtype)
        store_block_linears(transformer.requires_grad_(False).eval(), storage)
        text_encoder, tokenizer = build_tiny_text_encoder(seed + 1, dtype)
        return QwenImageComponents(
            transformer=transformer, vae=vae.requires_grad_(False).eval(), text_encoder=text_encoder,
            tokenizer=tokenizer, scheduler_config=dict(QWEN_IMAGE_SCHEDULER_CONFIG), compute_dtype=dtype,
            device=torch.device(device), family=self, name=f"tiny-toy-seed{seed}", storage=storage,
            text_encoder_loader=lambda: build_tiny_text_encoder(seed + 1, dtype))

    def planned_arch(self):
        """What the plan command plans: its transformer, built on the meta device (its other parts: the defaults)."""
        with torch.device("meta"):
            return arch_from_transformer(QwenImageTransformer2DModel(**TRANSFORMER))

    def demo(self):
        def make(folder):
            folder = write_demo_folder(Path(folder))
            cfg = DatasetConfig(folder=str(folder), resolution=64, min_bucket_side=32, max_bucket_side=128)
            return list(self.load_dataset(cfg).samples), None

        return DemoSpec(run_name="toy-demo", lora_name="toy_lora.safetensors", preview_prompt=PREVIEW_PROMPT,
                        plot_title="toy demo loss", make_dataset=make)


TOY = ToyCaptions()
FAMILIES = {NAME: TOY}
