"""The caching phase's two steps, term by term (phases.py sums them into the `cache` phase).

    prompts   the text encoder's weights (bf16, or its fp8 file's float8 Linears kept) and one prompt's forward;
              for Qwen-Image 2.1 editing (p.reference_sizes) that prompt is encoded with the largest sample's
              references: its vision tokens lengthen it, and the vision tower's forward runs first
              (references.py: its peak, and what it leaves alive through the language model's forward); for
              Qwen-Image-Edit the same with its control images as its processor sizes them (p.vision_sizes)
    latents   the VAE and one image's encode: the largest bucket, or with references the larger of the target
              and a reference (one image at a time)
"""

from __future__ import annotations

import dataclasses

from .inference import TEMPLATE_TOKENS, PartSizes, text_encoder_working_bytes, vae_element_bytes, vae_encode_bytes
from .plan import DTYPE_BYTES, GIB, PlanInputs, Term
from .references import prompt_tokens, vision_bytes


def cache_steps(p: PlanInputs, parts: PartSizes) -> tuple[list[Term], list[Term]]:
    """The device terms of caching's two steps: (prompts with the text encoder, latents with the VAE)."""
    act = DTYPE_BYTES[p.compute_dtype]
    float8 = p.text_encoder_storage == "float8"
    weights = parts.text_encoder_params * act - (parts.text_encoder_linear_params * (act - 1) if float8 else 0)
    upcast = parts.text_intermediate * parts.text_hidden * act if float8 else 0
    refs = p.reference_sizes if parts.vision_layers else ()  # a tower the plan knows (2.1's, Edit's)
    seen = (p.vision_sizes or refs) if parts.vision_layers else ()  # what the tower sees (Edit: its own smaller view)
    tower = f", vision tower {parts.vision_params / 1e9:.2f}B included" if parts.vision_params else ""
    tokens = prompt_tokens(dataclasses.replace(p, reference_sizes=seen), parts) if seen else p.text_tokens
    forward = text_encoder_working_bytes(parts, tokens, act)
    note = f"one prompt of {p.text_tokens} tokens, every hidden state kept"
    if seen:
        peak, kept = vision_bytes(parts, seen, act)
        sizes = ", ".join(f"{w}x{h}" for w, h in seen)
        note = (f"one prompt of {p.text_tokens} tokens with {len(seen)} image(s) ({sizes}): {tokens} tokens, "
                f"every hidden state kept, {forward / GIB:.2f} GiB + the vision tower's outputs kept "
                f"{kept / GIB:.2f} GiB; the tower's own forward before it peaks at {peak / GIB:.2f} GiB")
        embeddings = (tokens + TEMPLATE_TOKENS) * parts.text_hidden * act  # made before the tower runs
        forward = max(forward + kept, peak + embeddings)
    prompts = [
        Term("text encoder weights", weights, f"{parts.text_encoder_params / 1e9:.2f}B params{tower}, "
                                      f"{'float8 Linears' if float8 else p.compute_dtype}"),
        Term("text encoder forward", forward, note),
        Term("largest weight upcast", upcast, "float8 -> bf16, transient"),
    ]
    vae_b = vae_element_bytes(p)
    width, height, what = p.width, p.height, f"one {p.width}x{p.height} image"
    if refs:  # p.height holds the references' rows (planned_image_size): the target is the rest
        target = p.width * p.height - sum(w * h for w, h in refs)
        width, height = max([(p.width, -(-target // p.width)), *refs], key=lambda s: s[0] * s[1])
        what = f"one {width}x{height} image (the larger of the target and a reference)"
    latents = [
        Term("VAE weights", parts.vae_params * vae_b, f"{parts.vae_params / 1e6:.0f}M params"
             + (", float32 on the CPU" if vae_b != act else "")),
        Term("VAE encode", vae_encode_bytes(parts, width, height, vae_b), what),
    ]
    return prompts, latents
