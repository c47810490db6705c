"""What encoding every image and prompt alone (cache.py, for batch-independent entries) costs against
batches of `caching_batch_size`, on the tiny model (CPU). Each variant runs interleaved `--runs` times; the
median is reported.

    OMP_NUM_THREADS=1 python benchmarks/cache_encode_alone.py [--images 32] [--side 64] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer_core.families.qwen_image import build_tiny_components  # noqa: E402
from trainer_core.models.latents import encode_images  # noqa: E402
from trainer_core.models.text import encode_prompts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--side", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    components = build_tiny_components(seed=0, storage="float32")
    components.ensure_text_encoder()
    pixels = torch.rand(args.images, 3, args.side, args.side, generator=torch.Generator().manual_seed(0)) * 2 - 1
    prompts = [f"a {c} {s} number {i} on a white background" for i, (c, s) in
               enumerate((c, s) for c in ("red", "green", "blue", "yellow") for s in ("circle", "square", "star", "dot"))]
    prompts = (prompts * (args.images // len(prompts) + 1))[:args.images]
    b = args.batch
    variants = {
        "latents batched": lambda: [encode_images(components.vae, pixels[i:i + b]) for i in range(0, len(pixels), b)],
        "latents alone": lambda: [encode_images(components.vae, pixels[i:i + 1]) for i in range(len(pixels))],
        "prompts batched": lambda: [encode_prompts(components.text_encoder, components.tokenizer, prompts[i:i + b])
                                    for i in range(0, len(prompts), b)],
        "prompts alone": lambda: [encode_prompts(components.text_encoder, components.tokenizer, [p]) for p in prompts],
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():
        fn()  # warm up
    for _ in range(args.runs):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    print(f"{args.images} images {args.side}x{args.side} px / {args.images} prompts, batch {b}, "
          f"{torch.get_num_threads()} thread(s), median of {args.runs} runs:")
    for kind in ("latents", "prompts"):
        batched, alone = (statistics.median(times[f"{kind} {v}"]) for v in ("batched", "alone"))
        print(f"  {kind}: batched {batched * 1000:.1f} ms, alone {alone * 1000:.1f} ms "
              f"({alone / batched:.2f}x), runs alone {[round(t * 1000, 1) for t in times[f'{kind} alone']]}, "
              f"batched {[round(t * 1000, 1) for t in times[f'{kind} batched']]}")


if __name__ == "__main__":
    main()
