"""The standalone demo: a model family's built-in dataset and tiny model, a short training run.

The shapes model (`demo --model qwen-image-shapes`, `make demo`'s): the small pretrained Qwen-Image that ships
with the pack (models/pretrained.py) draws circles, squares and triangles; the demo teaches it stars, a shape it
never saw, from 8 pictures, and writes the preview before training beside the one after, so the eye sees it learn.

Text-to-image (`demo --model qwen-image`): a learnable pattern (one coloured shape per image, the caption
names colour and shape), so the loss falls within a few hundred CPU steps. Edit (`demo --model edit-2511`,
...): the same shapes painted from grey control images. The data and names are the family's
(`family.demo()`); the run is the same for all.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from ..core.config import LoraConfig, OptimizerConfig, TrainConfig
from ..core.files import remove_leftovers, write_bytes_atomic, write_error
from ..data.cache import build_cache
from ..data.demo_shapes import COLOURS, PREVIEW_PROMPT, SHAPES, make_demo_dataset  # noqa: F401 (the demo's data)
from ..families import DEFAULT, get_family
from ..families.base import DemoSpec
from ..families.loading import LoadRequest, load_model_set
from ..models.components import QwenImageComponents
from ..models.source import SHAPES as SHAPES_SOURCE
from ..models.pretrained import NAME as SHAPES_MODEL  # the shipped small pretrained model
from ..training import checkpoint
from ..training.plot import loss_plot
from .registry import open_run, release

# The cosine schedule's length is fixed (not --steps), so `demo --steps 3` resumed to 6 follows the very
# same learning rates as `demo --steps 6`.
SCHEDULE_STEPS = 200
RUN_NAME = "demo"
STAR_PROMPT = "a red star in the centre on a white background"  # the shapes demo's preview (shapes.STAR_SCENES[0])
# The shapes demo's settings, shared with the first-run workflow (tools/build_workflows.py) and
# run_files/shapes_stars.toml: every step sees all 8 star pictures.
SHAPES_LEARNING_RATE = 2e-3
SHAPES_MICRO_BATCH = 8


def _star_samples(folder: Path):
    from ..core.config import DatasetConfig
    from ..data.images import discover
    from ..devtools.shapes import SIZE, write_star_dataset

    folder = write_star_dataset(folder)
    return discover(DatasetConfig(folder=str(folder), resolution=SIZE, min_bucket_side=32, max_bucket_side=128)), None


def shapes_demo() -> DemoSpec:
    """The shapes model's demo: 8 stars (devtools/shapes.STAR_SCENES), previewed with a red star's prompt; a LoRA on
    the blocks' attention and MLP layers (on every layer it kept less of what the model drew right for other prompts;
    benchmarks/README.md), all 8 pictures in every step at a constant 2e-3: in 200 steps the previews are stars to
    the eye at every seed tried, where 2 pictures a step at 1e-3 (cosine) gave irregular blobs."""
    return DemoSpec(run_name=RUN_NAME, lora_name="demo_lora.safetensors", preview_prompt=STAR_PROMPT,
                    plot_title="demo loss (teaching the shapes model stars)", make_dataset=_star_samples,
                    lora_targets="attention+mlp", learning_rate=SHAPES_LEARNING_RATE,
                    micro_batch_size=SHAPES_MICRO_BATCH, schedule="constant")


@dataclass
class DemoResult:
    lora: Path
    preview: Path
    preview_before: Path | None  # the model before this run trained (None when it resumed a trained one)
    loss_plot: Path
    first_loss: float
    last_loss: float
    steps: int


def run_demo(out: str | Path, steps: int = 200, seed: int = 0, resume: bool = False, log=print,
             components: QwenImageComponents | None = None, blocks_to_swap: int | str = 1,
             model: str = DEFAULT) -> DemoResult:
    """Train to `steps` total steps on the family's built-in dataset; with `resume`, continue from the
    checkpoint in `out` first. `components` default to the tiny model of the family `model` (float8 blocks), or
    the shipped shapes model for SHAPES_MODEL; given, their own family decides. `blocks_to_swap` may be 'auto'.
    The run goes through the same recipe as the nodes (`runs.open_run`) and is released at the end."""
    if model == SHAPES_MODEL and components is None:
        components = load_model_set(LoadRequest(SHAPES_SOURCE, "cpu", storage="float8", compute_dtype="float32"))
    family = components.family if components is not None else get_family(model)
    spec = shapes_demo() if model == SHAPES_MODEL else family.demo()
    out = Path(out)
    run_dir = out / "run"
    if not resume:
        checkpoint.clear(run_dir)
    # of a killed demo
    remove_leftovers(out, names=rf"{re.escape(spec.lora_name)}|preview(_before)?\.png|loss\.png|losses\.json")
    try:
        samples, settings = spec.make_dataset(out / "dataset")
    except OSError as e:
        raise write_error(e, "demo dataset", out / "dataset", "") from None
    if components is None:
        components = family.tiny_components(seed=seed, storage="float8", compute_dtype=torch.float32)
    cached = build_cache(components, samples, out / "cache", preview_prompts=[spec.preview_prompt], settings=settings)
    log(f"model: {components.name} ({family.name}); cache: {cached.report.summary()}")
    run = open_run(
        components, cached,
        LoraConfig(rank=8, alpha=8.0, targets=spec.lora_targets),
        OptimizerConfig(optimizer="adamw8bit", learning_rate=spec.learning_rate, warmup_steps=10, schedule=spec.schedule,
                        schedule_steps=SCHEDULE_STEPS, min_lr_ratio=0.1),
        TrainConfig(run_name=spec.run_name, seed=seed, micro_batch_size=spec.micro_batch_size, gradient_checkpointing=True,
                    blocks_to_swap=blocks_to_swap, checkpoint_every=50),
        run_dir=run_dir,
    )
    trainer = run.trainer
    log(f"blocks_to_swap: {trainer.decided.swap.label}")
    if resume:
        log(f"resumed from step {trainer.step}" if run.action == "resumed" else f"no checkpoint in {run_dir}: starting at step 0")
    try:
        before = None
        if trainer.step == 0:
            before = _write_preview(trainer, spec, seed, out / "preview_before.png")
        trainer.train(max(0, steps - trainer.step),
                      on_step=lambda r: log(f"step {r.step:4d}  loss {r.loss:.4f}  lr {r.lr:.2e}")
                      if r.step == 1 or r.step % 25 == 0 else None)
        lora = trainer.save_lora(out / spec.lora_name)
        preview = _write_preview(trainer, spec, seed, out / "preview.png")
    finally:
        release(spec.run_name)  # the demo is a whole program: leave no live run behind
    history = trainer.progress.loss_history
    plot = _write_output(_png(loss_plot(history, title=spec.plot_title)), out / "loss.png", "loss plot", trainer.step)
    _write_output(json.dumps(history).encode(), out / "losses.json", "loss history", trainer.step)
    losses = [loss for _, loss in history]
    return DemoResult(lora=lora, preview=preview, preview_before=before, loss_plot=plot,
                      first_loss=losses[0] if losses else float("nan"),
                      last_loss=losses[-1] if losses else float("nan"), steps=trainer.step)


def _write_preview(trainer, spec: DemoSpec, seed: int, path: Path) -> Path:
    image = trainer.sample_preview(spec.preview_prompt, "", width=64, height=64, steps=20, cfg_scale=4.0, seed=seed)
    # 4x, keeping the shape (Layered's preview is a sheet of the composite and its layers)
    return _write_output(_png(image.resize((4 * image.width, 4 * image.height), Image.Resampling.NEAREST)), path,
                         "preview image", trainer.step)


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
