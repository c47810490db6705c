"""What a collapsing run looks like in the previews' movement (issue 41, item 5), on the shipped shapes model.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/preview_movement.py [--rates 2e-3,5e-2] [--steps 200] [--out DIR]

Trains `make demo`'s LoRA (runs/demo.py: the 8 star pictures, rank 8 on attention + MLP, 8-bit AdamW, a constant
learning rate, all 8 pictures a step) once per learning rate, with a live preview of the demo's star prompt every 25
steps (64 px, 20 steps, CFG 4, seed 0; the untrained model's at step 0), and prints per preview the mean loss of the
25 steps before it and how far the preview moved (training/live.py `PreviewMovement`: the mean absolute difference
of its pixels, 0-1, from the untrained preview and from the previous one). Writes each run's loss plot (with the
movement on its second axis) and the previews' grid into --out, and one JSON line per rate.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)

from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.data.cache import build_cache
from trainer_core.families.loading import LoadRequest, load_model_set
from trainer_core.runs.demo import SHAPES_SOURCE, shapes_demo
from trainer_core.training import StepExtras, Trainer
from trainer_core.training.live import PreviewSettings, step_grid
from trainer_core.training.plot import loss_plot

PREVIEW_EVERY = 25


def run(rate: float, steps: int, out: Path) -> dict:
    spec = shapes_demo()
    components = load_model_set(LoadRequest(SHAPES_SOURCE, "cpu", storage="float8", compute_dtype="float32"))
    samples, settings = spec.make_dataset(out / "dataset")
    cached = build_cache(components, samples, out / "cache", preview_prompts=[spec.preview_prompt], settings=settings)
    trainer = Trainer(components, cached, LoraConfig(rank=8, alpha=8.0, targets=spec.lora_targets),
                      OptimizerConfig(optimizer="adamw8bit", learning_rate=rate, schedule="constant"),
                      TrainConfig(run_name=f"movement-{rate:g}", micro_batch_size=spec.micro_batch_size,
                                  gradient_checkpointing=True, blocks_to_swap=0))
    extras = StepExtras(preview_every=PREVIEW_EVERY, preview=PreviewSettings(spec.preview_prompt, size=64, steps=20,
                                                                             cfg=4.0, seed=0))
    started = time.perf_counter()
    try:
        extras.untrained_preview(trainer)
        trainer.train(steps, work=extras.work())
        progress = trainer.progress
        loss_plot(progress.loss_history, title=f"shapes stars, lr {rate:g}",
                  previews=progress.preview_history).save(out / f"loss_{rate:g}.png")
        step_grid(trainer.step_previews, title=f"lr {rate:g}").save(out / f"previews_{rate:g}.png")
        losses = dict(progress.loss_history)
        rows = []
        for step, from_untrained, from_previous in progress.preview_history:
            window = [losses[s] for s in range(max(1, step - PREVIEW_EVERY + 1), step + 1) if s in losses]
            rows.append({"step": step, "mean_loss": round(sum(window) / len(window), 4) if window else None,
                         "moved_from_untrained": None if from_untrained is None else round(from_untrained, 4),
                         "moved_from_previous": None if from_previous is None else round(from_previous, 4)})
    finally:
        trainer.close()
    return {"learning_rate": rate, "steps": steps, "seconds": round(time.perf_counter() - started, 1), "previews": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="2e-3,5e-2", help="learning rates, comma-separated")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default=None, help="where the plots and previews go (default: a temporary folder)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="preview_movement_"))
    for rate in (float(r) for r in args.rates.split(",")):
        result = run(rate, args.steps, out / f"lr_{rate:g}")
        print(json.dumps(result), flush=True)
        for row in result["previews"]:
            print(f"  lr {rate:g} step {row['step']:4d}: loss {row['mean_loss']}, moved {row['moved_from_untrained']} "
                  f"from the untrained preview, {row['moved_from_previous']} from the previous", flush=True)
    print(f"plots and previews: {out}")


if __name__ == "__main__":
    main()
