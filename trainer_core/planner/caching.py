"""The caching phase's two steps, term by term (phases.py sums them into the `cache` phase).

    prompts   the text encoder's weights (bf16, or its one-byte file's Linears kept), less those of its streamed layers
              (streaming/encoder.py: p.text_encoder_streamed decoder layers, p.vision_streamed vision blocks, their
              frozen Linear weights in host memory and a ring of two layers' weights on the device), and one prompt's
              forward;
              for Qwen-Image 2.1 editing (p.reference_sizes) that prompt is encoded with the largest sample's
              references: its vision tokens lengthen it, and the vision tower's forward runs first
              (references.py: its peak, and what it leaves alive through the language model's forward); for
              Qwen-Image-Edit the same with its control images as its processor sizes them (p.vision_sizes)
    latents   the VAE and one image's encode: the largest bucket, or with references the larger of the target
              and a reference (one image at a time)
"""

from __future__ import annotations

import dataclasses

from ..streaming.arena import blob_chunks
from ..streaming.placement import ring_for
from .arch import QwenImageArch
from .inference import (
    TEMPLATE_TOKENS,
    PartSizes,
    real_parts,
    text_encoder_working_bytes,
    vae_element_bytes,
    vae_encode_bytes,
)
from .phase import HOST_RESERVE_BYTES, Phase, baseline, on_device
from .plan import DTYPE_BYTES, GIB, PlanInputs, Term
from .references import prompt_tokens, vision_bytes


def streamed_layer_bytes(p: PlanInputs, parts: PartSizes) -> tuple[int, int]:
    """(one decoder layer's, one vision block's) frozen Linear weights as they stream: one byte each when the file's
    one-byte Linears are kept, else the compute dtype. (The resident weights count the tower's Linears in the
    compute dtype whatever the file: a one-byte tower streams fewer bytes than it is planned to hold.)"""
    per = 1 if p.text_encoder_storage == "float8" else DTYPE_BYTES[p.compute_dtype]
    return parts.text_layer_linear_params * per, parts.vision_block_linear_params * per


def streamed_counts(p: PlanInputs, parts: PartSizes) -> tuple[int, int]:
    """(decoder layers, vision blocks) streamed, as many as the encoder has at most (a tower the plan knows)."""
    return min(p.text_encoder_streamed or 0, parts.text_layers), min(p.vision_streamed, parts.vision_layers)


def cache_host_terms(p: PlanInputs, parts: PartSizes) -> list[Term]:
    """Host RAM of the prompts step beyond the process: the streamed layers' masters (their weights read into host
    memory once, then the arena's)."""
    layer, block = streamed_layer_bytes(p, parts)
    decoder, vision = streamed_counts(p, parts)
    if not decoder and not vision:
        return []
    pinned = p.device == "cuda" and p.pin_masters
    terms = [Term("text encoder: streamed layers' masters", decoder * layer + vision * block,
                  f"{decoder} decoder layers, {vision} vision blocks, {'pinned' if pinned else 'pageable'}")]
    if pinned:  # each stack's swapper packs its masters into power-of-two chunks, one chunk filled at a time
        chunks = [blob_chunks(size, count) for size, count in ((layer, decoder), (block, vision)) if count]
        terms += [Term("text encoder: pinned arena slack", sum(sum(c) for c in chunks) - decoder * layer - vision * block,
                       "unused room in the masters' power-of-two chunks"),
                  Term("text encoder: pinned chunk being filled", max(max(c) for c in chunks),
                       "page-locked whole before the weights it receives are freed (streaming.arena)")]
    return terms


def cache_steps(p: PlanInputs, parts: PartSizes) -> tuple[list[Term], list[Term]]:
    """The device terms of caching's two steps: (prompts with the text encoder, latents with the VAE)."""
    act = DTYPE_BYTES[p.compute_dtype]
    float8 = p.text_encoder_storage == "float8"
    weights = parts.text_encoder_params * act - (parts.text_encoder_linear_params * (act - 1) if float8 else 0)
    layer, block = streamed_layer_bytes(p, parts)
    decoder, vision = streamed_counts(p, parts)
    weights -= decoder * layer + vision * block
    slots = (ring_for(decoder) * layer if decoder else 0) + (ring_for(vision) * block if vision else 0)
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
                                      f"{'one-byte Linears' if float8 else p.compute_dtype}"
                                      + (f", less {decoder} streamed decoder layers" if decoder else "")
                                      + (f", less {vision} streamed vision blocks" if vision else "")),
        Term("text encoder ring slots", slots, "two streamed layers' weights per streamed stack" if slots
             else "nothing streamed"),
        Term("text encoder forward", forward, note),
        Term("largest weight upcast", upcast, "one byte -> bf16, transient"),
    ]
    vae_b = vae_element_bytes(p)
    width, height = p.vae_image or (p.width, p.height)
    what = f"one {width}x{height} image"
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


def cache_phase(p: PlanInputs, parts: PartSizes) -> Phase:
    prompts, latents = cache_steps(p, parts)
    prompt_bytes, latent_bytes = sum(t.bytes for t in prompts), sum(t.bytes for t in latents)
    larger = prompts if prompt_bytes >= latent_bytes else latents
    in_flight = Term("tensor in flight", parts.text_encoder_largest * DTYPE_BYTES[p.compute_dtype],
                     "the largest text encoder tensor, read from its file")
    streamed = ""
    if p.text_encoder_streamed or p.vision_streamed:
        streamed = (f" ({min(p.text_encoder_streamed, parts.text_layers)} decoder layers"
                    + (f" and {min(p.vision_streamed, parts.vision_layers)} vision blocks" if p.vision_streamed else "")
                    + " streamed)")
    note = (f"text encoder step {prompt_bytes / GIB:.2f} GiB{streamed}, VAE step {latent_bytes / GIB:.2f} GiB, "
            "one after the other; before slack")
    host = [baseline(p), in_flight, *cache_host_terms(p, parts)]
    return on_device(p, larger, host, "cache", note)


def choose_text_encoder_storage(inputs: PlanInputs, gpu_budget_bytes: int | None = None, ram_bytes: int | None = None,
                                arch: QwenImageArch | None = None, parts: PartSizes | None = None) -> str:
    """The text encoder's precision while caching: inputs.text_encoder_storage unless it is "auto"; then
    "bfloat16" when the cache phase fits with it (the GPU budget; on the CPU, the RAM), else "float8" (the
    fp8_scaled file's float8 Linears kept: half the memory). A bf16 file has no float8 to keep: bfloat16."""
    if inputs.text_encoder_storage != "auto":
        return inputs.text_encoder_storage
    if not inputs.text_encoder_file_fp8:
        return "bfloat16"
    whole = dataclasses.replace(inputs, text_encoder_storage="bfloat16", text_encoder_streamed=0, vision_streamed=0)
    phase = cache_phase(whole, parts or real_parts())
    if inputs.device == "cuda":
        fits = gpu_budget_bytes is None or phase.gpu_bytes <= gpu_budget_bytes
    else:
        fits = ram_bytes is None or phase.host_bytes <= ram_bytes - HOST_RESERVE_BYTES
    return "bfloat16" if fits else "float8"


def prompts_step_gpu_bytes(inputs: PlanInputs, parts: PartSizes) -> int:
    """The GPU peak of caching's prompts step alone (the text encoder), slack and context included on CUDA."""
    prompts, _ = cache_steps(inputs, parts)
    return on_device(inputs, prompts, [], "cache").gpu_bytes


def choose_encoder_streaming(inputs: PlanInputs, gpu_budget_bytes: int | None = None,
                             parts: PartSizes | None = None) -> tuple[int, int]:
    """(decoder layers, vision blocks) to stream while caching: what `inputs` say unless text_encoder_streamed is
    None; then the fewest whose prompts step fits `gpu_budget_bytes` (none without a budget or on the CPU, where
    there is nothing to gain): decoder layers first (the larger share), then vision blocks; all of them when even that
    does not fit (the plan then says so). More streamed layers never need more GPU (the ring's two slots are there
    from the first streamed layer), so the search walks up from none."""
    if inputs.text_encoder_streamed is not None:
        return inputs.text_encoder_streamed, inputs.vision_streamed
    parts = parts or real_parts()
    if gpu_budget_bytes is None or inputs.device != "cuda":
        return 0, 0
    for decoder, vision in ([(d, 0) for d in range(parts.text_layers + 1)]
                            + [(parts.text_layers, v) for v in range(1, parts.vision_layers + 1)]):
        if decoder == 1 or vision == 1:
            continue  # one streamed layer costs its ring's two slots: never less than none
        trial = dataclasses.replace(inputs, text_encoder_streamed=decoder, vision_streamed=vision)
        if prompts_step_gpu_bytes(trial, parts) <= gpu_budget_bytes:
            return decoder, vision
    return parts.text_layers, parts.vision_layers
