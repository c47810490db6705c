"""Masked loss and differential output preservation measured on the shipped shapes model (issue 21).

    .venv/bin/python benchmarks/shape_effects.py masks [--run-file run_files/shapes_stars_masked.toml] [--seeds 0,1]
    .venv/bin/python benchmarks/shape_effects.py dop [--run-file run_files/shapes_stars_dop.toml] [--seeds 0,1]

Each trains its run file headless as shipped and with the feature changed (the same file, one setting changed:
masks: `mask_background_weight` 1 (no masking) and 0.1 (`--mask-weights`); dop: no `preservation_trigger` and
`preservation_weight = 0`), then
draws fixed prompts at fixed seeds without a LoRA and with each, with diffusers' own `QwenImagePipeline` and the
LoRA loaded by diffusers' `load_lora_weights` (shape_check.ShapePictures), and reads the pictures with
`shapes.measure` (no learned part). Prints one JSON line per trained variant and one for the base model.

masks (example_dataset/stars_on_floor: the demo's stars on a yellow floor band the captions never name, masks black
on the band):
- stars: share of the 10 star prompts (every colour and background, in the centre) whose picture, above the floor
  band, is a star (and of the named colour);
- floor: share of those pictures that draw the floor (over half of the band's pixels the floor's yellow), and the
  band's mean yellow share; the same share over the 30 trained-shape prompts (the floor leaking into other prompts);
- background kept: mean share of each star picture's pixels outside the star's place and above the band that are
  the named background;
- prior kept: shape_check's 30 trained-shape prompts drawn exactly as named.

dop (trigger "star", class word "circle"):
- class prompts: the 10 circle prompts in the centre (every colour and background; the captions with "star"
  replaced by "circle"): how many of their pictures `measure` reads the same (shape, colour, place) as the base
  model's picture at the same seed, and the mean absolute pixel difference to it (0..255);
- other shapes: the same for the 20 square and triangle prompts in the centre (not preserved);
- stars and prior kept, as in shape_concept.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from shape_concept import train_run_file  # noqa: E402
from trainer_core.devtools import shapes  # noqa: E402
from trainer_core.devtools.shape_check import STAR_PLACE, ShapePictures, prior_scenes, star_prompts  # noqa: E402
from trainer_core.families.qwen_image import load_shapes_model  # noqa: E402
from trainer_core.runs.run_file import render  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RUN_FILES = {"masks": REPO / "run_files" / "shapes_stars_masked.toml",
                     "dop": REPO / "run_files" / "shapes_stars_dop.toml"}
FLOOR_DRAWN = 0.5  # share of the band's pixels off the background from which a picture "draws the floor"


def variant(path: Path, kind: str, folder: Path, mask_weight: float | None = None) -> Path:
    """`path` with its feature changed, written into `folder` (dataset folders made absolute): masks: every dataset's
    mask_background_weight set to `mask_weight` (1 = no masking); dop: preservation off."""
    data = tomllib.loads(path.read_text())
    for entry in data["dataset"]:
        entry["folder"] = str((path.parent / entry["folder"]).resolve())
        if kind == "masks":
            entry["mask_background_weight"] = mask_weight
    if kind == "dop":
        data.get("cache", {}).pop("preservation_trigger", None)
        data.get("cache", {}).pop("preservation_class", None)
        data["train"]["preservation_weight"] = 0.0
    label = f"mask_background_weight_{mask_weight:g}" if kind == "masks" else "no_dop"
    data["train"]["run_name"] += f"_{label}".replace(".", "_")
    out = folder / f"{path.stem}_{label}.toml"
    out.write_text(render(data, header=f"{path.name} with {label} (benchmarks/shape_effects.py)"))
    return out


def same_scene_prompts(shape_names) -> list[tuple[str, str]]:
    return [(shapes.caption(c, s, STAR_PLACE, b), b) for s in shape_names for c in shapes.COLOURS
            for b in shapes.BACKGROUNDS]


def draw_all(pictures: ShapePictures, prompts, seeds) -> list[np.ndarray]:
    return [np.asarray(pictures.picture(p, s).convert("RGB"), dtype=np.float32) for p, _b in prompts for s in seeds]


def as_image(array: np.ndarray):
    from PIL import Image

    return Image.fromarray(array.astype(np.uint8))


def mask_figures(pictures: ShapePictures, seeds) -> dict:
    stars, prior = star_prompts(), [(sc.caption, sc.background) for sc in prior_scenes()]
    star_pics = [(as_image(a), b) for a, (p, b) in zip(draw_all(pictures, stars, seeds),
                                                         [pb for pb in stars for _ in seeds])]
    prior_pics = [(as_image(a), sc) for a, sc in zip(draw_all(pictures, prior, seeds),
                                                       [sc for sc in prior_scenes() for _ in seeds])]
    star_colours = [c for c in shapes.COLOURS for _b in shapes.BACKGROUNDS for _ in seeds]
    read = [shapes.measure(shapes.above_floor(im, b), b) for im, b in star_pics]
    cover = [shapes.floor_coverage(im) for im, _b in star_pics]
    kept_background = [shapes.background_share(im, b) for im, b in star_pics]
    prior_cover = [shapes.floor_coverage(im) for im, _sc in prior_pics]
    kept = [(m.shape, m.colour, m.place) == (sc.shape, sc.colour, sc.place)
            for m, sc in ((shapes.measure(im, sc.background), sc) for im, sc in prior_pics)]
    n = len(read)
    return {"stars": sum(m.shape == shapes.NEW_SHAPE for m in read) / n,
            "stars_colour": sum(m.shape == shapes.NEW_SHAPE and m.colour == c for m, c in zip(read, star_colours)) / n,
            "floor_in_star_prompts": sum(c > FLOOR_DRAWN for c in cover) / n,
            "floor_coverage_star_prompts": round(float(np.mean(cover)), 3),
            "background_kept_star_prompts": round(float(np.mean(kept_background)), 3),
            "floor_in_shape_prompts": round(sum(c > FLOOR_DRAWN for c in prior_cover) / len(prior_cover), 3),
            "prior": round(sum(kept) / len(kept), 3), "pictures": n + len(prior_pics)}


def dop_pictures(pictures: ShapePictures, seeds) -> dict[str, list[np.ndarray]]:
    return {"class": draw_all(pictures, same_scene_prompts(["circle"]), seeds),
            "other": draw_all(pictures, same_scene_prompts(["square", "triangle"]), seeds)}


def closeness(drawn: list[np.ndarray], base: list[np.ndarray], backgrounds: list[str]) -> dict:
    same = [(lambda m, n: (m.shape, m.colour, m.place) == (n.shape, n.colour, n.place))(
        shapes.measure(as_image(a), b), shapes.measure(as_image(o), b)) for a, o, b in zip(drawn, base, backgrounds)]
    return {"same_as_base": round(sum(same) / len(same), 3),
            "pixel_distance": round(float(np.mean([np.abs(a - o).mean() for a, o in zip(drawn, base)])), 2)}


def dop_figures(pictures: ShapePictures, seeds, base: dict[str, list[np.ndarray]],
                drawn: dict[str, list[np.ndarray]] | None = None) -> dict:
    """The figures of the pictures `pictures` draws now (`drawn`, when already drawn), compared with `base`."""
    drawn = drawn or dop_pictures(pictures, seeds)
    rates = pictures.rates(seeds)
    out = {"stars": rates.concept, "stars_colour": rates.concept_colour, "prior": round(rates.prior, 3)}
    for group, shape_names in (("class", ["circle"]), ("other", ["square", "triangle"])):
        backgrounds = [b for _p, b in same_scene_prompts(shape_names) for _ in seeds]
        named = [shapes.measure(as_image(a), b) for a, b in zip(drawn[group], backgrounds)]
        wanted = [(s, c) for s in shape_names for c in shapes.COLOURS for _b in shapes.BACKGROUNDS for _ in seeds]
        out[group] = {**closeness(drawn[group], base[group], backgrounds),
                      "as_named": round(sum((m.shape, m.colour, m.place) == (s, c, STAR_PLACE)
                                            for m, (s, c) in zip(named, wanted)) / len(named), 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("masks", "dop"))
    parser.add_argument("--run-file", type=Path, default=None, help="the run file (default: the shipped one)")
    parser.add_argument("--seeds", default="0,1", help="sampling seeds: one picture per prompt and seed")
    parser.add_argument("--mask-weights", default="1,0.1", type=lambda t: [float(w) for w in t.split(",")],
                        help="masks: also train with these mask_background_weight values (1 = no masking)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a temporary one)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    run_file = (args.run_file or DEFAULT_RUN_FILES[args.kind]).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "out"
        out.mkdir(parents=True, exist_ok=True)
        trained = {}
        if args.kind == "masks":
            runs = [("as shipped", run_file)] + [(f"mask_background_weight {w:g}", variant(run_file, "masks", out, w))
                                                 for w in args.mask_weights]
        else:
            runs = [("as shipped", run_file), ("without preservation", variant(run_file, "dop", out))]
        for name, path in runs:
            started = time.time()
            lora, steps, losses = train_run_file(path, out)
            trained[name] = (lora, {"steps": steps, "first_loss": round(losses[0], 4),
                                    "last_loss": round(losses[1], 4), "train_seconds": round(time.time() - started, 1)})
        pictures = ShapePictures(load_shapes_model(storage="float32", compute_dtype=torch.float32))
        started = time.time()
        if args.kind == "masks":
            print(json.dumps({"trained": "none (the shipped model)", "seeds": seeds, **mask_figures(pictures, seeds)}))
        else:
            base = dop_pictures(pictures, seeds)
            print(json.dumps({"trained": "none (the shipped model)", "seeds": seeds,
                              **dop_figures(pictures, seeds, base, base)}))
        for name, (lora, record) in trained.items():
            pictures.load_lora(lora)
            figures = mask_figures(pictures, seeds) if args.kind == "masks" else dop_figures(pictures, seeds, base)
            pictures.unload_lora()
            print(json.dumps({"trained": f"{run_file.name} ({name})", **record, **figures,
                              "measure_seconds_so_far": round(time.time() - started, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
