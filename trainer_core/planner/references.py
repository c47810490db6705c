"""What reference images add to the memory of Qwen-Image 2.1 editing (families/qwen_image21/references.py): the
caching phase's vision-tower forward and VAE encodes, and the preview's longer sequence and its prefix KV cache;
and what Qwen-Image-Edit's control images add to its caching phase (its Qwen2.5-VL tower, the same terms: p.vision_sizes).

A reference is sized by the pipeline to about control_resolution² px (sides multiples of 32; 0: 1024). One of
W x H px gives, with Qwen3-VL's vision tower (patch P = 16, 2 x 2 merge, temporal patch 2, width V, depth B):
    N = (H / P) (W / P) patches; pixels (N, 3 x 2 x P²) fp32 from the processor, cast to the tower's dtype
    N / 4 vision tokens (image slots) in the prompt, plus a few template tokens around them
    (H / 16) (W / 16) latent tokens before the target's (training and previews: one per 16 x 16 px)
The pipeline asks for every hidden state (`output_hidden_states=True`), which transformers hands the vision tower
too: it keeps its B + 1 hidden states (N, V) besides its merged outputs (1 + DeepStack of them, (N / 4, out)), and
those stay alive through the language model's forward after it (the model's local `mm_encoder_outputs`), with a
copy of the merged outputs each (`torch.cat(...).to(...)`); the pixels' cast is freed by then. The tower's own
peak is in its last block: what is kept by then + that block's transients, measured
(VISION_BLOCK_WORKING_PER_PATCH_CHANNEL); its attention runs per image, no N x N matrix (SDPA), so every term is
linear in N. The prompt's embeddings exist already while it runs (caching.py adds them). tests/families/test_qwen_image21_plan.py checks the tower's peak and
the whole prompt encoding with a reference against `memprobe.LiveBytes` on real-width layers.

    with_references(inputs, count, resolution)   the CLI's inputs with `count` square references (rows, sizes)
    prompt_tokens(p, parts)                       the prompt's tokens with its references' vision tokens
    vision_bytes(parts, sizes, act) -> (peak, kept)
"""

from __future__ import annotations

import dataclasses

# One Qwen3-VL vision block's forward without gradients (bf16), bytes per patch per unit of V above what it is
# handed (its input and the states already kept): its output, the qkv projection, RoPE's float32 products, the
# attention's output and the MLP. Measured with `LiveBytes` at the real width (1152, 16 heads of 72): 42112 B per
# patch, the same at 256² to 1024² px and at any depth (per-image SDPA: nothing quadratic).
VISION_BLOCK_WORKING_PER_PATCH_CHANNEL = 36.556
# The same for Qwen-Image-Edit's Qwen2.5-VL-7B tower (1280 wide, 16 heads of 80, MLP 3420, patch 14; window
# attention, full in blocks 7/15/23/31), on the control images the text encoder sees: 41618.1 B per patch with
# `LiveBytes` at the real width, the same at 392² to 784² px and with a window or a full-attention block (per-window /
# per-image SDPA: nothing quadratic). Its hidden states are recorded as Qwen3-VL's are (tests/families/test_qwen_image_edit_plan.py).
QWEN25_VISION_BLOCK_WORKING_PER_PATCH_CHANNEL = 32.514
# Template tokens a reference adds around its vision tokens ("<imageN><|vision_start|>...<|vision_end|>"): assumed,
# rounded up (the published tokenizer is not here).
TEMPLATE_TOKENS_PER_REFERENCE = 8
PIXEL_CHANNELS = 3  # the vision tower reads RGB (the pipeline composites an RGBA reference over white)


def reference_size(resolution: int) -> tuple[int, int]:
    """(W, H) of a square reference the pipeline sizes at `resolution` (0: its 1024), as `calculate_dimensions`."""
    from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_dimensions

    side = resolution or 1024
    w, h, _ = calculate_dimensions(side * side, 1.0)
    return int(w), int(h)


def with_references(inputs, count: int, resolution: int = 0):
    """`inputs` (a PlanInputs of the target's size) with `count` square references sized at `resolution`: their
    latent rows added to the height as `families.base.conditioned_image_size` adds them for a run."""
    if count == 0:
        return inputs
    sizes = (reference_size(resolution),) * count
    area = inputs.width * inputs.height + sum(w * h for w, h in sizes)
    height = -(-area // (inputs.width * 32)) * 32  # rows rounded up to the 32 px bucket grid
    return dataclasses.replace(inputs, height=height, reference_sizes=sizes)


def smaller_references(inputs, resolution: int) -> dict:
    """PlanInputs fields with each of inputs' references sized at `resolution` instead (the target's rows kept): a
    change the plan may suggest (control_resolution)."""
    target = inputs.width * inputs.height - sum(w * h for w, h in inputs.reference_sizes)
    target_inputs = dataclasses.replace(inputs, height=-(-target // inputs.width), reference_sizes=())
    changed = with_references(target_inputs, len(inputs.reference_sizes), resolution)
    return dict(height=changed.height, reference_sizes=changed.reference_sizes)


def patches(parts, size: tuple[int, int]) -> int:
    w, h = size
    return (h // parts.vision_patch) * (w // parts.vision_patch)


def slots(parts, size: tuple[int, int]) -> int:
    """Vision tokens (image slots in the prompt) of one reference."""
    return patches(parts, size) // parts.vision_merge ** 2


def prompt_tokens(p, parts) -> int:
    """Tokens of a prompt encoded with p's references (the chat template's own are added by the text encoder term)."""
    return p.text_tokens + sum(slots(parts, s) + TEMPLATE_TOKENS_PER_REFERENCE for s in p.reference_sizes)


def vision_bytes(parts, sizes, act: int) -> tuple[int, int]:
    """(the tower's peak, what it leaves alive through the language model's forward) for references `sizes`, above
    the weights; the processor's float32 pixels included. One forward over every reference's patches."""
    n = sum(patches(parts, s) for s in sizes)
    if not n or not parts.vision_layers:
        return 0, 0
    per_patch = PIXEL_CHANNELS * parts.vision_temporal_patch * parts.vision_patch ** 2
    pixels, cast = n * per_patch * 4, n * per_patch * act  # the processor's fp32 pixels; their cast (the tower's)
    hidden = n * parts.vision_hidden * act  # one recorded hidden state (N, V)
    merged = n // parts.vision_merge ** 2 * parts.vision_out * act  # one merged output (N / 4, out)
    deepstack_before_last = sum(1 for i in parts.vision_deepstack if i < parts.vision_layers - 1)
    peak = (pixels + cast + parts.vision_layers * hidden + deepstack_before_last * merged
            + int(parts.vision_working_per_patch_channel * parts.vision_hidden) * n)
    # After it: the pixels (the pipeline's inputs), every hidden state, the merged outputs and their copies.
    kept = pixels + (parts.vision_layers + 1) * hidden + 2 * (1 + len(parts.vision_deepstack)) * merged
    return peak, kept


def reference_latent_tokens(arch, sizes) -> int:
    """Latent tokens of the references before the target's (2.1: one per 16 x 16 px)."""
    return sum(arch.image_tokens(w, h) for w, h in sizes)


def prefix_kv_bytes(arch, p, n_txt: int, n_refs: int, act: int) -> int:
    """The preview's KV cache of the prompt + references prefix (2.1's pipeline with `causal_condition`: the first
    step stores every block's K and V of the prefix rows, later steps reuse them): one cache, and a second for the
    negative prompt under true CFG, both alive while the negative forward runs."""
    return (2 if p.preview_cfg else 1) * arch.num_blocks * 2 * (n_txt + n_refs) * arch.dim * act
