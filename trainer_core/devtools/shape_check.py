"""What a LoRA taught the shipped shapes model, measured on the pictures it draws (shapes.measure).

Two rates, each over a fixed list of prompts, one picture per prompt and seed:
- concept rate: how often a star prompt ("a red star in the centre on a black background", every colour and
  background, at the demo's place: 10 prompts) gives a star (`shapes.measure`: concave and fitting a five-point
  star; the share that is merely concave, what counted as a star before, is reported beside it);
- prior kept: how often a prompt of a trained shape (30 prompts: every shape and colour, two places and
  backgrounds each) gives exactly what it names (shape, colour and place).
Measured without and with the LoRA, the pictures made by diffusers' own `QwenImagePipeline` with the LoRA
file loaded by diffusers' `load_lora_weights` (what a diffusers user of the file gets).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from ..models.text import encode_prompts
from . import shapes


STAR_PLACE = "in the centre"  # where the demo's stars are (shapes.STAR_SCENES)


def star_prompts() -> list[tuple[str, str]]:
    """(prompt, background) of every star scene at the demo's place."""
    return [(shapes.caption(c, shapes.NEW_SHAPE, STAR_PLACE, b), b) for c in shapes.COLOURS for b in shapes.BACKGROUNDS]


def prior_scenes() -> list[shapes.Scene]:
    """Every trained shape in every colour at two places (cycling through the five) and both backgrounds."""
    places, backgrounds = list(shapes.PLACES), list(shapes.BACKGROUNDS)
    out = []
    for i, (s, c) in enumerate((s, c) for s in shapes.TRAINED_SHAPES for c in shapes.COLOURS):
        for j in range(2):
            out.append(shapes.Scene(c, s, places[(2 * i + j) % len(places)], backgrounds[(i + j) % 2]))
    return out


@dataclass
class ConceptRates:
    concept: float  # share of star prompts that gave a star
    concept_colour: float  # ... a star of the named colour
    concept_concave: float  # ... anything concave (solidity alone: the measure before a star had to fit a star)
    prior: float  # share of trained-shape prompts that gave exactly what they named
    pictures: int


class ShapePictures:
    """Pictures of the shapes model (components with every part loadable) for prompts, optionally with a LoRA."""

    def __init__(self, components, steps: int = 20, cfg: float = 4.0):
        from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

        components.ensure_text_encoder()
        self.text_encoder, self.tokenizer = components.text_encoder, components.tokenizer
        self.pipe = QwenImagePipeline(
            scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config),
            vae=components.ensure_vae(), text_encoder=None, tokenizer=None,
            transformer=components.ensure_transformer().eval())
        self.pipe.set_progress_bar_config(disable=True)
        self.dtype = components.compute_dtype
        self.steps, self.cfg = steps, cfg
        self._embeds: dict[str, torch.Tensor] = {}

    def load_lora(self, path: str | Path) -> None:
        self.pipe.load_lora_weights(str(path), adapter_name="checked")

    def unload_lora(self) -> None:
        self.pipe.unload_lora_weights()

    def embedding(self, prompt: str) -> torch.Tensor:
        if prompt not in self._embeds:
            self._embeds[prompt] = encode_prompts(self.text_encoder, self.tokenizer, [prompt])[0]  # (L, D)
        return self._embeds[prompt].unsqueeze(0).to(self.dtype)  # (1, L, D)

    @torch.no_grad()
    def picture(self, prompt: str, seed: int) -> Image.Image:
        positive, negative = self.embedding(prompt), self.embedding("")
        return self.pipe(
            prompt_embeds=positive, prompt_embeds_mask=torch.ones(positive.shape[:2], dtype=torch.long),
            negative_prompt_embeds=negative,
            negative_prompt_embeds_mask=torch.ones(negative.shape[:2], dtype=torch.long),
            true_cfg_scale=self.cfg, width=shapes.SIZE, height=shapes.SIZE, num_inference_steps=self.steps,
            generator=torch.Generator("cpu").manual_seed(seed), output_type="pil",
        ).images[0]

    def rates(self, seeds: Iterable[int] = (0,)) -> ConceptRates:
        seeds = list(seeds)
        star = [shapes.measure(self.picture(p, s), b) for p, b in star_prompts() for s in seeds]
        prior = [(scene, shapes.measure(self.picture(scene.caption, s), scene.background))
                 for scene in prior_scenes() for s in seeds]
        stars = [m.shape == shapes.NEW_SHAPE for m in star]
        concave = [m.shape is not None and m.solidity < shapes.SOLIDITY_CONCAVE for m in star]
        coloured = [m.shape == shapes.NEW_SHAPE and m.colour == c
                    for m, c in zip(star, [c for c in shapes.COLOURS for _b in shapes.BACKGROUNDS for _ in seeds])]
        kept = [(m.shape, m.colour, m.place) == (sc.shape, sc.colour, sc.place) for sc, m in prior]
        return ConceptRates(concept=sum(stars) / len(stars), concept_colour=sum(coloured) / len(coloured),
                            concept_concave=sum(concave) / len(concave), prior=sum(kept) / len(kept),
                            pictures=len(star) + len(prior))
