"""Measure the working memory of one block's backward and print `WORKING_PER_TOKEN` for the planner.

    .venv/bin/python tools/calibrate_activations.py [--heads 4] [--grid 64] [--text 256]

Working memory is a block's measured peak (forward + backward, `memprobe.probe_block`) minus what the
block saves (`planner.activations.block_saved_bytes`, exact). It is reported per token of the longer
stream and per unit of MLP width F, the form in which it scales: the ratio is the same at 2, 4 and 8
heads to 0.1% (measured while writing this), so a narrow block on a CPU gives the real model's number.
Block Linears are stored in bf16 here, so no float8 upcast is in the peak (the planner adds the largest
upcast as its own term). Default sizes are the 1024 x 1024 proportions: 64 x 64 image tokens, 256 text.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import torch

    from trainer_core.core.config import LoraConfig
    from trainer_core.devtools.memprobe import probe_block
    from trainer_core.devtools.random_weights import random_transformer
    from trainer_core.adapters.lora import inject_lora, remove_lora
    from trainer_core.models.qwen_arch import LORA_TARGET_PRESETS
    from trainer_core.planner.activations import ActivationSettings, block_saved_bytes
    from trainer_core.planner.arch import arch_from_transformer

    parser = argparse.ArgumentParser()
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--grid", type=int, default=64, help="image tokens per side")
    parser.add_argument("--text", type=int, default=256)
    parser.add_argument("--rank", type=int, default=4)
    args = parser.parse_args()

    # Two blocks: block 0 is then not the last block, whose text-stream modules get no LoRA.
    model = random_transformer(dict(num_layers=2, num_attention_heads=args.heads), storage="bfloat16")
    arch = arch_from_transformer(model)
    n_img, longest = args.grid ** 2, max(args.grid ** 2, args.text)
    table = {}
    for preset, dtype, dropout, ckpt in itertools.product(
            LORA_TARGET_PRESETS, ("float32", "bfloat16"), (False, True), (True, False)):
        params = inject_lora(model, LoraConfig(rank=args.rank, alpha=args.rank, targets=preset, dtype=dtype,
                                               dropout=0.1 if dropout else 0.0), seed=0)
        model.train()
        with torch.no_grad():
            for p in params:
                p.normal_(0, 0.01)
        probe = probe_block(model, 1, (args.grid, args.grid), args.text, checkpointing=ckpt)
        settings = ActivationSettings(preset=preset, rank=args.rank,
                                      lora_bytes=4 if dtype == "float32" else 2, dropout=dropout, cuda=False,
                                      checkpointing=ckpt)
        saved = block_saved_bytes(arch, settings, 1, n_img, args.text)
        assert saved == probe.saved_bytes, (preset, dtype, dropout, saved, probe.saved_bytes)
        table[(preset, dtype, dropout, ckpt)] = round((probe.peak_bytes - saved) / (arch.mlp_dim * longest), 3)
        print(f"{preset:14s} {dtype:9s} dropout={dropout!s:5s} checkpointing={ckpt!s:5s} "
              f"saved {saved:>11,d}  peak {probe.peak_bytes:>11,d}  working/(F x tokens) {table[preset, dtype, dropout, ckpt]}",
              flush=True)
        remove_lora(model)
        model.requires_grad_(False)
    print("\nWORKING_PER_TOKEN = {")
    for key, value in table.items():
        print(f"    {key!r}: {value},")
    print("}")


if __name__ == "__main__":
    main()
