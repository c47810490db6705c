"""The caching phase at each budget: what streams, and the timeline model's seconds for 100 captions.

    .venv/bin/python benchmarks/caching_time_table.py

For Qwen-Image (Qwen2.5-VL-7B, ComfyUI's fp8 scaled file) and Qwen-Image 2.1 (Qwen3-VL-8B, ComfyUI's int8 ConvRot file),
each at 24 / 16 / 12 / 8 GiB: the text encoder's storage the plan picks (bf16 where it fits whole, else the file's
one-byte Linears kept), the decoder layers streamed (the fewest whose prompts step fits), and `caching_time` on two
GPUs for 100 prompts of 256 tokens (planner/caching_time.py: a floor; streaming's share of it on the safe side).
"""

import dataclasses

import common  # noqa: F401  (puts the repository on sys.path)

from trainer_core.planner import GIB, PlanInputs
from trainer_core.planner.caching import choose_encoder_streaming, choose_text_encoder_storage, prompts_step_gpu_bytes
from trainer_core.planner.caching_time import caching_time
from trainer_core.planner.gpus import GPUS
from trainer_core.families.qwen_image21.plan import real_parts21
from trainer_core.planner.inference import real_parts

GPU_NAMES = ("rtx4060ti-16gb", "rtx4090")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the first row only (benchmarks/smoke.py: that it runs)")
    smoke = parser.parse_args().smoke
    print("| model | budget | text encoder | decoder layers streamed | prompts step | "
          + " | ".join(f"100 captions, {GPUS[g].label} (resident)" for g in GPU_NAMES) + " |")
    print("|---|---:|---|---:|---:|" + "---:|" * len(GPU_NAMES))
    models = (("Qwen-Image", real_parts), ("Qwen-Image 2.1", lambda: real_parts21(lm_head=False)))
    for model, parts_of in models[:1] if smoke else models:
        parts = parts_of()
        for gib in (24,) if smoke else (24, 16, 12, 8):
            p = PlanInputs(text_encoder_streamed=None, text_encoder_file_fp8=True)
            p = dataclasses.replace(p, text_encoder_storage=choose_text_encoder_storage(p, gib * GIB, parts=parts))
            decoder, vision = choose_encoder_streaming(p, gib * GIB, parts)
            p = dataclasses.replace(p, text_encoder_streamed=decoder, vision_streamed=vision)
            times = [caching_time(p, parts, GPUS[g], 100) for g in GPU_NAMES]
            storage = "bf16" if p.text_encoder_storage == "bfloat16" else "one byte (file's)"
            print(f"| {model} | {gib} GiB | {storage} | {decoder} of {parts.text_layers} | "
                  f"{prompts_step_gpu_bytes(p, parts) / GIB:.2f} GiB | "
                  + " | ".join(f"{t.seconds:.1f} s ({t.resident_seconds:.1f} s)" for t in times) + " |")


if __name__ == "__main__":
    main()
