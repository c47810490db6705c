"""Qwen-Image 2.1's preview hooks: the pinned `QwenImage21Pipeline` samples, with or without reference images.

Without references the pipeline samples from cached prompt embeddings as it is. With references, its
`__call__` would encode the images itself (it takes prompt embeddings only without images: it has no argument
for their image slots), so it is called text-to-image around `ReferencedTransformer`, which does to every
transformer call what the image-conditioned `__call__` does differently: the reference tokens before the
target's, their `img_shapes` entries first, and the prompt's image slots in `img_mask` (the text-to-image call
marks none). The denoising loop, schedule, KV cache of the prefix, true CFG and decoding stay the pipeline's.

References come from the cached preview sample (its latents, and the preview prompts cached with it) or from
images given now (the canvas): those are sized by the dataset's `control_resolution`, encoded on the spot with
the prompts, the text encoder brought back for it and released after.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from PIL import Image

from ...core.errors import UserInputError
from ..sampling import WrappedTransformer, prompt_embedding
from .objective import padded_slots
from .references import (
    check_reference_size,
    encode_reference_latents,
    encode_reference_prompt,
    prepare_reference,
    reference_pipeline,
    reference_shapes,
    reference_tokens,
)
from .turbo import TURBO_SCHEDULER, is_turbo

MAX_REFERENCES = 10  # 2.1 edits with up to ten (ComfyUI's 2.1 encode node takes sixteen); the edit datasets read ten


@dataclass
class References:
    latents: list[torch.Tensor]  # [(C, h_i, w_i)]
    slots: torch.Tensor  # (P,) bool: the image slots of every prompt seen with them, up to the last slot


class ReferencedTransformer(WrappedTransformer):
    """`transformer` with fixed references put into every call as the image-conditioned pipeline does (module
    docstring). The pipeline reads its config, blocks (the KV cache), dtype, device and cache contexts."""

    def __init__(self, transformer: torch.nn.Module, references: References):
        super().__init__(transformer)
        self.references = references

    def forward(self, hidden_states: torch.Tensor, img_shapes, img_mask: torch.Tensor, encoder_hidden_states,
                **kwargs):
        b, length = hidden_states.shape[0], encoder_hidden_states.shape[1]
        refs = self.references
        tokens = reference_tokens(refs.latents).to(hidden_states.device, hidden_states.dtype)  # (1, M, C)
        shapes = [[*reference_shapes(refs.latents), *entry] for entry in img_shapes]
        mask = img_mask.clone()
        mask[:, :length] = padded_slots([refs.slots] * b, length, img_mask.device)
        return self.inner(hidden_states=torch.cat([tokens.expand(b, -1, -1), hidden_states], dim=1),
                          img_shapes=shapes, img_mask=mask, encoder_hidden_states=encoder_hidden_states, **kwargs)


def common_slots(slots: list[torch.Tensor]) -> torch.Tensor:
    """The image slots the prompts share (each prompt's, cut after its last slot); refused when they differ."""
    cut = [s[: int(s.nonzero().max()) + 1] for s in slots]
    if any(not torch.equal(c, cut[0]) for c in cut):
        raise ValueError("prompts seen with the same references have their image slots at different positions")
    return cut[0]


@torch.no_grad()
def encode_given_references(components, images: list[Image.Image], prompts: list[str], control_resolution: int
                            ) -> tuple[References, dict[str, torch.Tensor]]:
    """References of `images` and each prompt's embedding with them (for references from the canvas)."""
    components.ensure_vae()
    components.ensure_text_encoder()
    try:
        pipe = reference_pipeline(components)
        names = [f"{i + 1} (canvas)" for i in range(len(images))]
        prepared = [prepare_reference(pipe, img, check_reference_size(n, *img.size, control_resolution))
                    for n, img in zip(names, images)]
        latents = [encode_reference_latents(pipe, p.pixels, components.compute_dtype) for p in prepared]
        encoded = {p: encode_reference_prompt(pipe, p, prepared, components.device, names)
                   for p in dict.fromkeys(prompts)}
    finally:
        components.release_text_encoder()
        components.park_vae()
    slots = common_slots([s for _e, s in encoded.values()])
    return References(latents, slots), {p: e for p, (e, _s) in encoded.items()}


def preview_inputs(components, dataset, prompts: list[str], images: list[Image.Image] | None
                   ) -> tuple[References | None, dict[str, torch.Tensor]]:
    """(references or None, {prompt: (L, D) embedding}): of `images` (encoded now), else the cached preview
    sample's references and the prompts cached with them, else text-to-image (the cached prompts)."""
    settings = dataset.settings
    if images:
        if len(images) > MAX_REFERENCES:
            raise UserInputError(f"{len(images)} reference images were given, but Qwen-Image 2.1 previews take at "
                                 f"most {MAX_REFERENCES}.")
        return encode_given_references(components, [i.convert("RGB") for i in images], prompts,
                                       getattr(settings, "control_resolution", 0) or 0)
    embeds = {p: prompt_embedding(dataset, p) for p in dict.fromkeys(prompts)}
    sample = dataset.preview_sample
    if sample is None or not sample.condition_keys:
        return None, embeds
    slots = common_slots([dataset.text_tensor(dataset.prompt_keys[p], "image_slots") for p in embeds])
    return References([dataset.latents(k).float() for k in sample.condition_keys], slots), embeds


def preview_pipeline(components, references: References | None):
    """The pinned `QwenImage21Pipeline` around our transformer (with the references put in) and VAE."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline

    processor = components.tokenizer if components.tokenizer is not None else components.processor_loader()
    transformer = components.transformer
    if references is not None:
        device, dtype = components.device, components.compute_dtype
        transformer = ReferencedTransformer(transformer, References([r.to(device, dtype) for r in references.latents],
                                                                    references.slots))
    # Turbo's sigmas are final: the scheduler neither shifts nor stretches them (turbo.py)
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config,
                                                           **(TURBO_SCHEDULER if is_turbo(components) else {}))
    return QwenImage21Pipeline(scheduler=scheduler, vae=components.vae, text_encoder=None, processor=processor,
                               transformer=transformer)
