"""Worker of test_rss_after_save.py, in a fresh process (so the resident memory is this run's alone): a run on the CPU
(the tiny model, or a real-width one with `--real-width BLOCKS` blocks of Qwen-Image's width), its resident memory after
init, after a checkpoint, after a LoRA save and after close, and the memory plan's host figures of those phases, as one
JSON line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import torch


def resident() -> int:
    """Anonymous + shared resident memory now (what the plan's host figures count; libraries' file pages are not)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return sum(int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssShmem"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--real-width", type=int, default=0, help="blocks of Qwen-Image's width (0: the tiny model)")
    args = parser.parse_args()
    here = Path(__file__).resolve()
    sys.path[:0] = [str(here.parents[2]), str(here.parents[1])]  # the repository, tests/ (conftest's helpers)
    from conftest import cached_demo

    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.families.qwen_image import build_tiny_components
    from trainer_core.models.tiny import TINY_TRANSFORMER
    from trainer_core.planner import arch_for_components, inputs_for_run, plan_phases
    from trainer_core.planner.inference import parts_for_components
    from trainer_core.runs.demo import make_demo_dataset
    from trainer_core.training import Trainer

    # real width: bfloat16, the storage and compute the plan's figures are for (float32 would be twice its weights)
    components = build_tiny_components(seed=0, storage="bfloat16", compute_dtype=torch.bfloat16) if args.real_width \
        else build_tiny_components(seed=0, storage="float32")
    if args.real_width:
        from diffusers import QwenImageTransformer2DModel

        torch.manual_seed(0)  # Qwen-Image's block width (24 heads of 128: 3072), `--real-width` blocks
        components.transformer = QwenImageTransformer2DModel(**dict(
            TINY_TRANSFORMER, num_layers=args.real_width, attention_head_dim=128, num_attention_heads=24,
            axes_dims_rope=(16, 56, 56))).to(torch.bfloat16).requires_grad_(False)
    work = Path(tempfile.mkdtemp(prefix="rss_after_save_"))
    cached = cached_demo(components, make_demo_dataset(work / "demo"), work / "cache")
    lora, optimizer = LoraConfig(rank=8, targets="attention+mlp"), OptimizerConfig(optimizer="adamw8bit")
    train = TrainConfig(run_name="rss", seed=0, gradient_checkpointing=True)
    inputs = dataclasses.replace(inputs_for_run(components, cached, lora, optimizer, train, 0), device="cpu")
    plan = plan_phases(inputs, arch_for_components(components), parts=parts_for_components(components), suggest=False)
    trainer = Trainer(components, cached, lora, optimizer, train, run_dir=work / "run")
    measured = {"init": resident()}
    trainer.train(1)
    trainer.save_checkpoint()
    measured["checkpoint"] = resident()
    trainer.save_lora(work / "out.safetensors")
    measured["save"] = resident()
    lora_bytes = sum(p.numel() * p.element_size() for p in components.transformer.parameters() if p.requires_grad)
    trainer.close()
    del trainer
    measured["close"] = resident()
    print(json.dumps({"measured": measured, "planned": {n: p.host_bytes for n, p in plan.phases.items()},
                      "lora_bytes": lora_bytes}))


if __name__ == "__main__":
    main()
