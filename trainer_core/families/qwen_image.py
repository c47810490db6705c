"""Qwen-Image text-to-image (and Qwen-Image-2512, the same architecture): the first instance of the family seam.

A sample is a target image and its caption; nothing else conditions it. The prompt is encoded alone with
the text-to-image pipeline's template (models/text.py), the transformer sees the target's tokens only and
the loss covers all of them. The files are read by models/ (single_file.py, diffusers_dir.py, tiny.py,
pretrained.py, source.py), whose loaders know no family; the entry points at the end of this module call them
and hand the model set this family (and decide the text encoder's fp8 'auto' for the device first).

Tensors: latents (C, h, w); packed tokens (B, N = h/2 * w/2, 4C); prompt embeddings (L, D).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..core.errors import UserInputError
from .base import CacheConditioning, DemoSpec, ModelFamily

# The built-in demo data: one coloured shape per image, the caption names colour and shape (learnable in
# a few hundred CPU steps). The Edit family's demo paints the same shapes.
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "yellow": (235, 200, 30)}
SHAPES = ("circle", "square")
PREVIEW_PROMPT = "a red circle on a white background"


def text_key(prompt: str, text_fingerprint: str) -> str:
    """Cache key of a prompt embedding: the text, the encoder's identity (tokenizer included), the template."""
    from ..data.cache import CACHE_VERSION
    from ..models.text import pipeline_prompt_constants

    template, max_tokens = pipeline_prompt_constants()
    parts = (CACHE_VERSION, template, str(max_tokens), text_fingerprint, prompt)
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


class PromptsOnly(CacheConditioning):
    """Text-to-image caching: each prompt encoded alone, whatever sample it belongs to; no condition latents.
    A text-to-image family with another encoder (Qwen-Image 2.1) changes `text_key` and `encode_one`."""

    def __init__(self, components):
        self.components = components
        self.text_fingerprint = components.fingerprint("text_encoder")

    def text_key(self, prompt: str, sample) -> str:
        return text_key(prompt, self.text_fingerprint)

    def encode_one(self, prompt: str):
        """The prompt's embedding (L, D)."""
        from ..models.text import encode_prompts

        return encode_prompts(self.components.text_encoder, self.components.tokenizer, [prompt])[0]

    def encode_prompts(self, jobs, write) -> None:
        for key, (prompt, _sample) in jobs.items():
            write({"embedding": self.encode_one(prompt)}, "text", key, f"prompt {prompt[:40]!r}")


def make_demo_dataset(folder: str | Path, size: int = 64) -> Path:
    """Write 8 images (4 colours x 2 shapes, one of them wide) with captions into `folder`."""
    from PIL import Image, ImageDraw

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for n, (colour, shape) in enumerate((c, s) for c in COLOURS for s in SHAPES):
        width = size * 2 if n == 7 else size  # one wide image: a second aspect bucket
        img = Image.new("RGB", (width, size), "white")
        draw = ImageDraw.Draw(img)
        m = size // 4
        box = (width // 2 - m, m, width // 2 + m, size - m)
        (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLOURS[colour])
        img.save(folder / f"{n:02d}_{colour}_{shape}.png")
        (folder / f"{n:02d}_{colour}_{shape}.txt").write_text(f"a {colour} {shape} on a white background\n")
    return folder


def _demo_samples(folder: Path):
    from ..core.config import DatasetConfig
    from ..data.images import discover

    folder = make_demo_dataset(folder)
    return discover(DatasetConfig(folder=str(folder), resolution=64, min_bucket_side=32, max_bucket_side=128)), None


class QwenImage(ModelFamily):
    name = "qwen-image"

    def check_samples(self, samples) -> None:
        from .qwen_image_edit.data import EditSample

        from .qwen_image_layered.data import LayeredSample

        if any(isinstance(s, LayeredSample) for s in samples):
            raise UserInputError("the loaded model is a text-to-image Qwen-Image, but this dataset is a layered dataset: "
                                 "load a Qwen-Image-Layered transformer (qwen_image_layered_bf16.safetensors).")
        if any(isinstance(s, EditSample) for s in samples):
            raise UserInputError("the loaded model is a text-to-image Qwen-Image, but this dataset is an edit dataset: "
                                 "load a Qwen-Image-Edit transformer (Edit, Edit-2509 or Edit-2511).")

    def cache_conditioning(self, components, samples, settings) -> CacheConditioning:
        self.check_samples(samples)
        return PromptsOnly(components)

    def preview_inputs(self, components, dataset, prompts, condition_images):
        from .sampling import prompt_embedding

        if condition_images:
            raise UserInputError("control images were connected to Preview, but the model is a text-to-image "
                                 "Qwen-Image: disconnect them, or train a Qwen-Image-Edit model.")
        return None, {p: prompt_embedding(dataset, p) for p in dict.fromkeys(prompts)}

    def preview_pipeline(self, components, conditions):
        from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

        return QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config),
                                 vae=components.vae, text_encoder=None, tokenizer=None,
                                 transformer=components.transformer)

    def tiny_components(self, seed=0, storage="float32", compute_dtype=None, device="cpu"):
        import torch

        return build_tiny_components(seed=seed, storage=storage, compute_dtype=compute_dtype or torch.float32,
                                     device=device)

    def demo(self) -> DemoSpec:
        return DemoSpec(run_name="demo", lora_name="demo_lora.safetensors", preview_prompt=PREVIEW_PROMPT,
                        plot_title="demo loss", make_dataset=_demo_samples)


QWEN_IMAGE = QwenImage()


# -- text-to-image model sets: models/'s loaders, with this family handed over ---------------------------------


def text_to_image(components):
    """`components` (read by a loader of models/) as a text-to-image Qwen-Image."""
    components.family = QWEN_IMAGE
    return components


def build_tiny_components(*args, **kwargs):
    """`models.tiny.build_tiny_components` (same arguments), of this family."""
    from ..models.tiny import build_tiny_components as build

    return text_to_image(build(*args, **kwargs))


def load_single_files(transformer, text_encoder, vae, tokenizer_dir=None, storage: str = "float8",
                      compute_dtype=None, device="cpu", text_encoder_fp8: str = "auto", **kwargs):
    """`models.single_file.load_single_files`, of this family; `text_encoder_fp8` may be the Load settings'
    'auto', decided here for `device` (`planner.resolve_text_encoder_fp8`) before anything takes its memory."""
    import torch

    from ..models.single_file import load_single_files as load
    from ..planner.device import CachingPlacement, resolve_text_encoder_fp8

    fp8 = resolve_text_encoder_fp8(text_encoder_fp8, device)
    components = load(transformer, text_encoder, vae, tokenizer_dir, storage, compute_dtype or torch.bfloat16, device, fp8,
                      **kwargs)
    components.text_encoder_placement = CachingPlacement(components, one_byte=fp8 == "keep")
    return text_to_image(components)


def load_diffusers_dir(*args, **kwargs):
    """`models.diffusers_dir.load_diffusers_dir` (same arguments), of this family."""
    from ..models.diffusers_dir import load_diffusers_dir as load

    return text_to_image(load(*args, **kwargs))


def load_shapes_model(*args, **kwargs):
    """`models.pretrained.load_shapes_model` (same arguments: the shipped small model), of this family."""
    from ..models.pretrained import load_shapes_model as load

    return text_to_image(load(*args, **kwargs))


def load_model_set(source: str, device, *args, text_encoder_fp8: str = "dequantize", **kwargs):
    """`models.source.load_model_set` (any of the Load settings' sources), of this family; `text_encoder_fp8`
    may be 'auto', decided here for `device` when the source is model files (the only one that reads it)."""
    from ..models.source import FILES
    from ..models.source import load_model_set as load
    from ..planner.device import CachingPlacement, resolve_text_encoder_fp8

    if source == FILES:
        text_encoder_fp8 = resolve_text_encoder_fp8(text_encoder_fp8, device)
    components = load(source, device, *args, text_encoder_fp8=text_encoder_fp8, **kwargs)
    if source == FILES:
        components.text_encoder_placement = CachingPlacement(components, one_byte=text_encoder_fp8 == "keep")
    return text_to_image(components)
