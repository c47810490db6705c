"""The standalone demo: a generated dataset, the tiny built-in model, a short training run.

The dataset is a learnable pattern (one coloured shape per image, the caption names colour and shape),
so the loss falls within a few hundred CPU steps.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image, ImageDraw

from . import checkpoint
from .cache import build_cache
from .config import DatasetConfig, LoraConfig, OptimizerConfig, TrainConfig
from .data import discover
from .files import remove_leftovers, write_bytes_atomic, write_error
from .models.components import QwenImageComponents
from .models.tiny import build_tiny_components
from .plot import loss_plot
from .runs import open_run, release

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "yellow": (235, 200, 30)}
SHAPES = ("circle", "square")
PREVIEW_PROMPT = "a red circle on a white background"
# The cosine schedule's length is fixed (not --steps), so `demo --steps 3` resumed to 6 follows the very
# same learning rates as `demo --steps 6`.
SCHEDULE_STEPS = 200
RUN_NAME = "demo"


def make_demo_dataset(folder: str | Path, size: int = 64) -> Path:
    """Write 8 images (4 colours x 2 shapes, one of them wide) with captions into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for n, (colour, shape) in enumerate((c, s) for c in COLOURS for s in SHAPES):
        width = size * 2 if n == 7 else size  # one wide image: a second aspect bucket
        img = Image.new("RGB", (width, size), "white")
        draw = ImageDraw.Draw(img)
        m = size // 4
        box = (width // 2 - m, m, width // 2 + m, size - m)
        (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLOURS[colour])
        img.save(folder / f"{n:02d}_{colour}_{shape}.png")
        (folder / f"{n:02d}_{colour}_{shape}.txt").write_text(f"a {colour} {shape} on a white background\n")
    return folder


@dataclass
class DemoResult:
    lora: Path
    preview: Path
    loss_plot: Path
    first_loss: float
    last_loss: float
    steps: int


def run_demo(out: str | Path, steps: int = 200, seed: int = 0, resume: bool = False, log=print,
             components: QwenImageComponents | None = None, blocks_to_swap: int | str = 1) -> DemoResult:
    """Train to `steps` total steps on the generated dataset; with `resume`, continue from the checkpoint in
    `out` first. `components` default to the built-in tiny model (float8 blocks). `blocks_to_swap` may be
    'auto'. The run goes through the same recipe as the nodes (`runs.open_run`) and is released at the end."""
    out = Path(out)
    run_dir = out / "run"
    if not resume:
        checkpoint.clear(run_dir)
    remove_leftovers(out, names=r"demo_lora\.safetensors|preview\.png|loss\.png|losses\.json")  # of a killed demo
    try:
        dataset_dir = make_demo_dataset(out / "dataset")
    except OSError as e:
        raise write_error(e, "demo dataset", out / "dataset", "") from None
    if components is None:
        components = build_tiny_components(seed=seed, storage="float8", compute_dtype=torch.float32)
    dataset_cfg = DatasetConfig(folder=str(dataset_dir), resolution=64, min_bucket_side=32, max_bucket_side=128)
    cached = build_cache(components, discover(dataset_cfg), out / "cache", preview_prompts=[PREVIEW_PROMPT])
    log(f"cache: {cached.report.summary()}")
    run = open_run(
        components, cached,
        LoraConfig(rank=8, alpha=8.0, targets="all"),
        OptimizerConfig(optimizer="adamw8bit", learning_rate=2e-3, warmup_steps=10, schedule="cosine",
                        schedule_steps=SCHEDULE_STEPS, min_lr_ratio=0.1),
        TrainConfig(run_name=RUN_NAME, seed=seed, micro_batch_size=2, gradient_checkpointing=True,
                    blocks_to_swap=blocks_to_swap, checkpoint_every=50),
        run_dir=run_dir,
    )
    trainer = run.trainer
    log(f"blocks_to_swap: {trainer.train_cfg.blocks_to_swap}" + (" (auto)" if trainer.requested_train_cfg.auto_swap else ""))
    if resume:
        log(f"resumed from step {trainer.step}" if run.action == "resumed" else f"no checkpoint in {run_dir}: starting at step 0")
    try:
        trainer.train(max(0, steps - trainer.step),
                      on_step=lambda r: log(f"step {r.step:4d}  loss {r.loss:.4f}  lr {r.lr:.2e}")
                      if r.step == 1 or r.step % 25 == 0 else None)
        lora = trainer.save_lora(out / "demo_lora.safetensors")
        preview = _write_output(_png(trainer.sample_preview(PREVIEW_PROMPT, "", width=64, height=64, steps=20,
                                                            cfg_scale=4.0, seed=seed)
                                     .resize((256, 256), Image.Resampling.NEAREST)),
                                out / "preview.png", "preview image", trainer.step)
    finally:
        release(RUN_NAME)  # the demo is a whole program: leave no live run behind
    plot = _write_output(_png(loss_plot(trainer.loss_history, title="demo loss")), out / "loss.png", "loss plot",
                         trainer.step)
    _write_output(json.dumps(trainer.loss_history).encode(), out / "losses.json", "loss history", trainer.step)
    losses = [loss for _, loss in trainer.loss_history]
    return DemoResult(lora=lora, preview=preview, loss_plot=plot, first_loss=losses[0] if losses else float("nan"),
                      last_loss=losses[-1] if losses else float("nan"), steps=trainer.step)


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _write_output(data: bytes, path: Path, what: str, step: int) -> Path:
    """Write one of the demo's outputs atomically (an earlier one stays whole), or say why it could not be."""
    try:
        return write_bytes_atomic(data, path)
    except OSError as e:
        raise write_error(e, what, path, f"Any earlier {path.name} is intact; the run's checkpoint holds step "
                                         f"{step}.") from None
