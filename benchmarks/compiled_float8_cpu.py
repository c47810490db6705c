"""The compiled float8 path (`models.float8.compiled`) against the eager one on the CPU: training steps of real-width
blocks, and what compiling costs.

    .venv/bin/python benchmarks/compiled_float8_cpu.py compiled [--blocks 2] [--steps 6] [--json PATH]
    .venv/bin/python benchmarks/compiled_float8_cpu.py eager    [--blocks 2] [--steps 6] [--json PATH]

Model: `--blocks` real Qwen-Image blocks (3072 wide, 24 heads, joint dim 3584; ~340 MB each in float8) with random
float8_scaled block weights (`devtools.random_weights`), bf16 compute. Training: a rank-16 attention+mlp LoRA
computed in bf16 (`lora.compute_in_input_dtype`, as the trainer does), AdamW, `streaming.runner.BlockRunner` with
gradient checkpointing (modulation cache included), 8 x 8 packed latent tokens and 32 prompt tokens per step: few tokens on
purpose, so the weight-sized work (what the two paths do differently) dominates. The same seeds give both modes
the same weights and batches.

Prints, and writes to `--json`: seconds of the first step (compilation included), the median of the other steps,
the graphs Dynamo compiled in the first step and after it, and the losses. Whole-process times of the two modes
(imports and model building included) are best taken from outside, run in turn, e.g. `/usr/bin/time -v`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import common  # noqa: F401  (puts the repository on sys.path)

import torch
import torch._dynamo

from trainer_core.core.config import LoraConfig
from trainer_core.devtools.random_weights import random_transformer
from trainer_core.adapters.lora import compute_in_input_dtype, inject_lora, lora_parameters
from trainer_core.training.objective import flow_loss
from trainer_core.streaming.runner import BlockRunner

GRID, TEXT = 8, 32  # packed latent tokens per side, prompt tokens


def graphs_compiled() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["eager", "compiled"])
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", default=None, help="append this run's figures as one JSON line")
    parser.add_argument("--smoke", action="store_true", help="1 block 256 wide (benchmarks/smoke.py: that it runs)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    config = dict(num_layers=1, num_attention_heads=2) if args.smoke else dict(num_layers=args.blocks)
    model = random_transformer(config, storage="float8_scaled", compute_dtype=torch.bfloat16)
    inject_lora(model, LoraConfig(rank=16, alpha=16.0, targets="attention+mlp"), seed=0)
    compute_in_input_dtype(model)
    params = lora_parameters(model)
    runner = BlockRunner(model, torch.device("cpu"), checkpointing=True, compile_float8=args.mode == "compiled",
                         compile_on_cpu=True)
    assert runner.compiled_float8 == (args.mode == "compiled")
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    cfg = model.config
    g = torch.Generator().manual_seed(1)
    seconds, graphs, losses = [], [], []
    for _ in range(args.steps):
        x = torch.randn(1, GRID * GRID, cfg.in_channels, generator=g).bfloat16()  # (B, tokens, 4 x 16 channels)
        prompt = torch.randn(1, TEXT, cfg.joint_attention_dim, generator=g).bfloat16()  # (B, text tokens, 3584)
        target = torch.randn(1, GRID * GRID, cfg.out_channels * 4, generator=g)
        before, t = graphs_compiled(), time.perf_counter()
        prediction = model(hidden_states=x, encoder_hidden_states=prompt, timestep=torch.tensor([0.5]).bfloat16(),
                           img_shapes=[[(1, GRID, GRID)]], return_dict=False)[0]
        loss = flow_loss(prediction, target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - t)
        graphs.append(graphs_compiled() - before)
        losses.append(float(loss))
    runner.uninstall()
    figures = dict(mode=args.mode, blocks=args.blocks, steps=args.steps, threads=torch.get_num_threads(),
                   first_step_s=round(seconds[0], 3), median_step_s=round(statistics.median(seconds[1:] or seconds), 3),
                   graphs_first_step=graphs[0], graphs_after=sum(graphs[1:]), losses=[round(v, 6) for v in losses])
    print(json.dumps(figures), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(figures) + "\n")
    return figures


if __name__ == "__main__":
    main()
