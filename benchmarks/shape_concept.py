"""What the demo LoRA taught the shipped shapes model, measured on the pictures it draws (issue 26).

    .venv/bin/python benchmarks/shape_concept.py [--steps 200] [--seeds 0,1] [--out DIR] [--grid docs/demo_stars.png]
    .venv/bin/python benchmarks/shape_concept.py --run-file run_files/shapes_stars_regularized.toml

Trains the `make demo` LoRA (runs/demo.py: 8 star pictures, 200 steps, the demo's settings) into `--out` (a
temporary folder by default), then draws every prompt of `devtools/shape_check` without and with it, with
diffusers' own `QwenImagePipeline` and the LoRA file loaded by diffusers' `load_lora_weights`, and reads each
picture back with `shapes.measure` (no learned part: foreground, solidity, extent, mean colour, centroid):

- concept rate: share of the 50 star prompts (every colour, place and background) that gave a star;
- concept + colour: ... a star of the named colour;
- prior kept: share of the 30 trained-shape prompts that gave exactly the shape, colour and place they name.

`--run-file` trains that run file headless instead (`train --config`, its own steps; e.g. the stars with a
regularisation set) and measures its last LoRA the same way. Prints one JSON line (the figures before and after, the run's losses, seconds); benchmarks/README.md keeps them.
`--grid` also writes the README's picture: GRID_PROMPTS (four star prompts, then four of trained shapes) drawn
without the LoRA (top row) and with it (bottom row), seed 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from trainer_core.devtools import shapes  # noqa: E402
from trainer_core.devtools.shape_check import ShapePictures  # noqa: E402
from trainer_core.families.qwen_image import load_shapes_model  # noqa: E402
from trainer_core.runs.demo import SHAPES_MODEL, run_demo  # noqa: E402


GRID_PROMPTS = (
    ("a red star in the centre on a white background", "white"),
    ("a blue star in the centre on a white background", "white"),
    ("a yellow star in the centre on a black background", "black"),
    ("a green star in the centre on a black background", "black"),
    ("a purple circle in the centre on a white background", "white"),
    ("a red square at the top left on a black background", "black"),
    ("a green triangle at the bottom left on a white background", "white"),
    ("a yellow circle at the top right on a black background", "black"),
)
TILE = 128


def grid_row(pictures: ShapePictures) -> list[Image.Image]:
    return [pictures.picture(prompt, 0).resize((TILE, TILE), Image.Resampling.NEAREST) for prompt, _ in GRID_PROMPTS]


def write_grid(before: list[Image.Image], after: list[Image.Image], path: Path) -> None:
    """Two rows of tiles, each labelled with what `shapes.measure` reads in it; the row titles on the left."""
    label_h, left = 16, 64
    sheet = Image.new("RGB", (left + TILE * len(before), 2 * (TILE + label_h)), "white")
    pen = ImageDraw.Draw(sheet)
    for row, (title, tiles) in enumerate((("before", before), ("after", after))):
        y = row * (TILE + label_h)
        pen.text((4, y + TILE // 2), title, fill="black")
        for i, (tile, (_prompt, background)) in enumerate(zip(tiles, GRID_PROMPTS)):
            sheet.paste(tile, (left + i * TILE, y))
            m = shapes.measure(tile, background)
            pen.text((left + i * TILE + 4, y + TILE + 2), f"{m.colour or '-'} {m.shape or 'nothing'}", fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path)


def train_run_file(path: Path, out: Path) -> tuple[Path, int, tuple[float, float]]:
    """`train --config path --output out`: (its last LoRA file, steps, (first, last) loss)."""
    from trainer_core.runs.cli import main as cli
    from trainer_core.runs.run_file import read_run_file

    if cli(["train", "--config", str(path), "--output", str(out)]) != 0:
        raise SystemExit(f"training {path} failed")
    run, _ = read_run_file(path)
    run_dir = out / run.train.run_name
    losses = [loss for _step, loss in json.loads((run_dir / "losses.json").read_text())["loss"]]
    lora = sorted(run_dir.glob(f"{run.train.run_name}_*.safetensors"))[-1]
    return lora, len(losses), (losses[0], losses[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="demo steps (make demo's: 200)")
    parser.add_argument("--seeds", default="0,1", help="sampling seeds: one picture per prompt and seed")
    parser.add_argument("--out", type=Path, default=None, help="demo folder (default: a temporary one)")
    parser.add_argument("--grid", type=Path, default=None, help="also write the before/after picture here")
    parser.add_argument("--run-file", type=Path, default=None, help="train this run file instead of the demo")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "demo"
        started = time.time()
        if args.run_file is None:
            demo = run_demo(out, steps=args.steps, model=SHAPES_MODEL, log=lambda *_: None)
            lora, steps, losses = demo.lora, demo.steps, (demo.first_loss, demo.last_loss)
        else:
            lora, steps, losses = train_run_file(args.run_file, out)
        train_seconds = time.time() - started
        pictures = ShapePictures(load_shapes_model(storage="float32", compute_dtype=torch.float32))
        started = time.time()
        before = pictures.rates(seeds)
        row_before = grid_row(pictures) if args.grid else []
        pictures.load_lora(lora)
        after = pictures.rates(seeds)
        if args.grid:
            write_grid(row_before, grid_row(pictures), args.grid)
        measure_seconds = time.time() - started
    print(json.dumps({"trained": str(args.run_file or "make demo"), "steps": steps, "seeds": seeds,
                      "first_loss": round(losses[0], 4), "last_loss": round(losses[1], 4), "before": dataclasses.asdict(before),
                      "after": dataclasses.asdict(after), "train_seconds": round(train_seconds, 1),
                      "measure_seconds": round(measure_seconds, 1), "threads": torch.get_num_threads()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
