"""Measure what a reference image costs Qwen-Image 2.1's prompt encoding (`trainer_core/planner/references.py`) at the
real widths, and the text encoder's remainder per token there (`planner/inference.py` TEXT21_EXTRA_PER_TOKEN).

    OMP_NUM_THREADS=1 .venv/bin/python tools/calibrate_qwen21_references.py [--side 1024] [--layers 4] [--depth 3]

Real widths, bf16 on the CPU, random weights, `memprobe.LiveBytes` (peaks above the inputs):
- the vision tower alone (Qwen3-VL-8B's: 1152 wide, 16 heads, patch 16, merge 2; `--depth` blocks, DeepStack after
  the first two) on one --side² px reference: its last block's working bytes per patch per unit of width;
- the pipeline's `encode_prompt` text-to-image with a language model of the real width (4096, MLP 12288, `--layers`
  layers, the tiny tokenizer's vocabulary): per token, what is left beyond the plan's text encoder terms;
- the same with the reference: the measured peak against the plan's term for that model. The processor's float32
  pixels are made from numpy, which `LiveBytes` does not see: they are taken out of the plan's figure here.
Uses about 3 GB at the defaults: run it under `flock /work/wt/memheavy.lock` and benchmarks/memory_cap.py there.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def encoder(layers: int, depth: int, deepstack: list[int]):
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from trainer_core.families.qwen_image21.processor import build_processor
    from trainer_core.families.qwen_image21.tiny import tiny_text_config
    from trainer_core.families.qwen_image21.arch import QWEN3_VL_8B_CONFIG
    from trainer_core.models.tiny import SPECIAL_TOKENS, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    cfg = tiny_text_config(len(tokenizer), {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS})
    cfg["text_config"].update({k: v for k, v in QWEN3_VL_8B_CONFIG["text_config"].items() if k != "vocab_size"},
                              num_hidden_layers=layers)
    cfg["text_config"]["rope_parameters"]["mrope_section"] = [24, 20, 20]  # Qwen3-VL's, head size 128
    cfg["vision_config"] = dict(QWEN3_VL_8B_CONFIG["vision_config"], depth=depth, deepstack_visual_indexes=deepstack)
    config = Qwen3VLConfig(**cfg)
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration._from_config(config, torch_dtype=torch.bfloat16)
    return model.eval().requires_grad_(False), build_processor(tokenizer, config.vision_config)


def encode_peak(model, processor, prompt: str, image) -> tuple[int, int]:
    """(peak bytes, tokens) of the pipeline's `encode_prompt` (with `image`, or text-to-image for None)."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline

    from trainer_core.devtools.memprobe import LiveBytes
    from trainer_core.families.qwen_image21.tiny import QWEN_IMAGE21_SCHEDULER_CONFIG

    pipe = QwenImage21Pipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_config(QWEN_IMAGE21_SCHEDULER_CONFIG),
                               vae=None, text_encoder=model, processor=processor, transformer=None)
    seen = {}
    hook = model.model.language_model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.update(tokens=kw["inputs_embeds"].shape[1]), with_kwargs=True)
    with torch.no_grad(), LiveBytes() as live:
        pipe.encode_prompt(prompt, image=None if image is None else [image], device="cpu")
    hook.remove()
    return live.peak, seen["tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--side", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--depth", type=int, default=3)
    args = parser.parse_args()
    import torch
    from PIL import Image

    from trainer_core.devtools.memprobe import LiveBytes
    from trainer_core.families.qwen_image21.plan import real_parts21
    from trainer_core.planner.inference import TEMPLATE_TOKENS, text_encoder_working_bytes, vision_fields
    from trainer_core.planner.references import patches, vision_bytes

    deepstack = list(range(min(2, args.depth - 1)))
    model, processor = encoder(args.layers, args.depth, deepstack)
    parts = dataclasses.replace(real_parts21(), text_layers=args.layers, text_extra_per_token=0,
                                text_logits_per_token=model.lm_head.out_features, **vision_fields(model))
    n, g = patches(parts, (args.side, args.side)), args.side // 16
    pixels = torch.randn(n, 3 * 2 * 16 * 16)
    with torch.no_grad(), LiveBytes() as live:
        model.model.visual(pixels.to(torch.bfloat16), grid_thw=torch.tensor([[1, g, g]]), output_hidden_states=True)
    # per patch before the last block's transients: the cast pixels, the hidden states so far, DeepStack outputs
    kept_before = 3 * 2 * 256 * 2 + args.depth * 1152 * 2 + sum(i < args.depth - 1 for i in deepstack) * 4096 // 2
    print(f"vision tower, {args.depth} blocks, {n} patches: peak {live.peak} B = {live.peak / n:.0f} B per patch; "
          f"the last block's working {(live.peak / n - kept_before) / 1152:.3f} B per patch per channel")

    text = "a photo of a cat " * 24
    peak, tokens = encode_peak(model, processor, text, None)
    remainder = (peak - text_encoder_working_bytes(parts, tokens - TEMPLATE_TOKENS)) / tokens
    print(f"text-to-image, {args.layers} layers of 4096, {tokens} tokens: peak {peak} B, remainder {remainder:.0f} B "
          "per token beyond the plan's text encoder terms")

    image = Image.new("RGBA", (args.side, args.side), (10, 200, 30, 255))
    peak, tokens = encode_peak(model, processor, "a photo of a cat " * 8, image)
    tower_peak, kept = vision_bytes(parts, [(args.side, args.side)], 2)
    unseen = n * 3 * 2 * 256 * 4  # the processor's float32 pixels
    for label, extra in (("", 0), (f", with that remainder", int(remainder))):
        lm = text_encoder_working_bytes(dataclasses.replace(parts, text_extra_per_token=extra),
                                        tokens - TEMPLATE_TOKENS)
        plan = max(lm + kept, tower_peak + tokens * parts.text_hidden * 2) - unseen  # the embeddings made before
        print(f"with a {args.side}² reference, {tokens} tokens: measured {peak / 2**20:.1f} MiB, plan{label} "
              f"{plan / 2**20:.1f} MiB: plan / measured {plan / peak:.4f}")


if __name__ == "__main__":
    main()
