"""The built-in tiny edit dataset and the edit demo (`python -m trainer_core demo --model edit-2511`).

The dataset is a learnable edit: control 1 is a grey shape, control 2 (Edit-2509/2511) a swatch of a colour,
and the target is that shape painted in that colour; the caption says so ("paint the circle red"). With Edit
(one control) the caption alone names the colour. Controls use the same-folder form (`name_control.png`,
`name_control_2.png`); one control is wider than its target, so the controls keep their own aspect ratio.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from PIL import Image, ImageDraw

from ... import checkpoint
from ...config import DatasetConfig, LoraConfig, OptimizerConfig, TrainConfig
from ...demo import COLOURS, SHAPES, SCHEDULE_STEPS, DemoResult, _png, _write_output
from ...files import remove_leftovers, write_error
from ...plot import loss_plot
from .cache import build_edit_cache
from .config import EditDataConfig
from .data import load_edit_dataset
from .variants import get_variant

GREY = (128, 128, 128)
RUN_NAME = "edit_demo"
# Tiny controls: the model's own rule (1024 px) costs a CPU ~30 s per VAE encode. At 96 px of side the
# 32 px grid keeps the demo's square and 2:1 controls exact.
CONTROL_RESOLUTION = 96
PREVIEW_PROMPT = "paint the circle red"


def _shape(size: tuple[int, int], shape: str, colour) -> Image.Image:
    img = Image.new("RGB", size, "white")
    w, h = size
    m = min(w, h) // 4
    box = (w // 2 - m, h // 2 - m, w // 2 + m, h // 2 + m)
    (ImageDraw.Draw(img).ellipse if shape == "circle" else ImageDraw.Draw(img).rectangle)(box, fill=colour)
    return img


def make_edit_demo_dataset(folder: str | Path, controls: int = 2, size: int = 64) -> Path:
    """8 edit samples (4 colours x 2 shapes) with `controls` (1 or 2) control images each, into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for n, (colour, shape) in enumerate((c, s) for c in COLOURS for s in SHAPES):
        name = f"{n:02d}_{colour}_{shape}"
        _shape((size, size), shape, COLOURS[colour]).save(folder / f"{name}.png")
        control_size = (size * 2, size) if n == 3 else (size, size)  # one wider control (2:1)
        _shape(control_size, shape, GREY).save(folder / f"{name}_control.png")
        if controls >= 2:
            Image.new("RGB", (size // 2, size // 2), COLOURS[colour]).save(folder / f"{name}_control_2.png")
        (folder / f"{name}.txt").write_text(f"paint the {shape} {colour}\n")
    return folder


def run_edit_demo(out: str | Path, variant: str = "edit-2511", steps: int = 200, seed: int = 0, resume: bool = False,
                  log=print, components=None, blocks_to_swap: int | str = 1) -> DemoResult:
    """Train an edit LoRA to `steps` total steps on the built-in edit dataset (as `demo.run_demo`); the preview
    paints the first sample's controls with the preview prompt. `components`: an edit model set (default: the
    tiny one of `variant`)."""
    from ...runs import open_run, release
    from .tiny import build_tiny_edit_components

    out = Path(out)
    run_dir = out / "run"
    if not resume:
        checkpoint.clear(run_dir)
    remove_leftovers(out, names=r"edit_lora\.safetensors|preview\.png|loss\.png|losses\.json")
    if components is None:
        components = build_tiny_edit_components(variant, seed=seed, storage="float8", compute_dtype=torch.float32)
    edit = components.edit or get_variant(variant)
    try:
        dataset_dir = make_edit_demo_dataset(out / "dataset", controls=min(2, edit.max_controls))
    except OSError as e:
        raise write_error(e, "demo dataset", out / "dataset", "") from None
    dataset = load_edit_dataset(DatasetConfig(folder=str(dataset_dir), resolution=64, min_bucket_side=32,
                                              max_bucket_side=128), EditDataConfig(control_resolution=CONTROL_RESOLUTION))
    cached = build_edit_cache(components, list(dataset.samples), out / "cache", preview_prompts=[PREVIEW_PROMPT],
                              control_resolution=CONTROL_RESOLUTION)
    log(f"model: {components.name} ({edit.name}); cache: {cached.report.summary()}")
    run = open_run(
        components, cached, LoraConfig(rank=8, alpha=8.0, targets="all"),
        OptimizerConfig(optimizer="adamw8bit", learning_rate=2e-3, warmup_steps=10, schedule="cosine",
                        schedule_steps=SCHEDULE_STEPS, min_lr_ratio=0.1),
        TrainConfig(run_name=RUN_NAME, seed=seed, micro_batch_size=2, gradient_checkpointing=True,
                    blocks_to_swap=blocks_to_swap, checkpoint_every=50),
        run_dir=run_dir)
    trainer = run.trainer
    if resume:
        log(f"resumed from step {trainer.step}" if run.action == "resumed" else f"no checkpoint in {run_dir}: starting at step 0")
    try:
        trainer.train(max(0, steps - trainer.step),
                      on_step=lambda r: log(f"step {r.step:4d}  loss {r.loss:.4f}  lr {r.lr:.2e}")
                      if r.step == 1 or r.step % 25 == 0 else None)
        lora = trainer.save_lora(out / "edit_lora.safetensors")
        image = trainer.sample_preview(PREVIEW_PROMPT, "", width=64, height=64, steps=20, cfg_scale=4.0, seed=seed)
        preview = _write_output(_png(image.resize((256, 256), Image.Resampling.NEAREST)), out / "preview.png",
                                "preview image", trainer.step)
    finally:
        release(RUN_NAME)
    plot = _write_output(_png(loss_plot(trainer.loss_history, title=f"{edit.name} demo loss")), out / "loss.png",
                         "loss plot", trainer.step)
    _write_output(json.dumps(trainer.loss_history).encode(), out / "losses.json", "loss history", trainer.step)
    losses = [loss for _, loss in trainer.loss_history]
    return DemoResult(lora=lora, preview=preview, loss_plot=plot, first_loss=losses[0] if losses else float("nan"),
                      last_loss=losses[-1] if losses else float("nan"), steps=trainer.step)
