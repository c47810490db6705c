"""The small pretrained model shipped with the pack (models/pretrained.py), its training script
(tools/train_shapes_model.py) and the shape measurement the quality checks count with (shapes.py)."""

import hashlib
import random
import sys

import pytest
import torch

from conftest import REPO

from trainer_core.models.pretrained import have_shipped_model

# No weights ship yet (benchmarks/README.md, "Small pretrained model"): the tests of the shipped files wait for them.
needs_weights = pytest.mark.skipif(not have_shipped_model(), reason="no small pretrained model files in pretrained/")


def test_measure_reads_back_every_drawn_scene():
    """Every shape (the star too) in every colour, place and background, at the sizes and jitters the script
    draws: measured as what it is."""
    from trainer_core.devtools import shapes

    rng = random.Random(0)
    for shape in (*shapes.TRAINED_SHAPES, shapes.NEW_SHAPE):
        for colour in shapes.COLOURS:
            for place in shapes.PLACES:
                for background in shapes.BACKGROUNDS:
                    scene = shapes.Scene(colour, shape, place, background, radius=rng.uniform(10, 14),
                                         dx=rng.uniform(-2, 2), dy=rng.uniform(-2, 2))
                    m = shapes.measure(shapes.draw(scene), background)
                    assert (m.shape, m.colour, m.place) == (shape, colour, place), scene
    blank = shapes.measure(shapes.draw(shapes.Scene("red", "circle", "in the centre", "white", radius=1.0)), "white")
    assert blank.shape is None  # a dot is no shape


def _short_run(out, seed=0):
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import train_shapes_model
    finally:
        sys.path.pop(0)
    args = ["--out", str(out), "--seed", str(seed), "--vae-steps", "2", "--vae-batch", "2", "--images", "6",
            "--steps", "3", "--batch", "4", "--vae-check", "4"]
    assert train_shapes_model.main(args) == 0
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "training.json")
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """(folder, file hashes) of one short run from seed 0, shared by the tests that only read its files."""
    out = tmp_path_factory.mktemp("shapes_run") / "m"
    return out, _short_run(out)


def test_training_script_reproduces_its_files_from_the_seed(tmp_path, short_run):
    """Two short runs from one seed write the same bytes (every file of the model set); another seed differs."""
    first = short_run[1]
    assert _short_run(tmp_path / "b") == first
    assert {"diffusion_models/qwen_image_shapes_bf16.safetensors", "vae/qwen_image_shapes_vae.safetensors",
            "text_encoders/qwen_2.5_vl_shapes.safetensors", "tokenizer/tokenizer.json"} <= set(first)
    other = _short_run(tmp_path / "c", seed=1)
    transformer = "diffusion_models/qwen_image_shapes_bf16.safetensors"
    text_encoder = "text_encoders/qwen_2.5_vl_shapes.safetensors"
    assert other[transformer] != first[transformer]
    assert other[text_encoder] == first[text_encoder]  # the frozen tiny encoder, whatever the seed


def test_the_scripts_files_load_in_both_layouts(tmp_path, short_run):
    """What the script writes loads through ComfyUI's single-file loader; written as a diffusers folder it loads
    through the diffusers-folder loader to the same model: same prompt features, same transformer output, same
    decoded picture. (A short run's files: the shipped ones are the same files of a longer run.)"""
    from trainer_core.families.qwen_image import load_diffusers_dir
    from trainer_core.models import save_diffusers_dir
    from trainer_core.models.latents import decode_latents
    from trainer_core.families.qwen_image import load_shapes_model
    from trainer_core.models.pretrained import LATENT_CHANNELS, SHAPES_TRANSFORMER
    from trainer_core.models.text import encode_prompts

    files = load_shapes_model(storage="float32", compute_dtype=torch.float32, root=short_run[0])
    files.ensure_text_encoder(), files.ensure_vae(), files.ensure_transformer()
    assert files.num_blocks == SHAPES_TRANSFORMER["num_layers"]
    folder = load_diffusers_dir(save_diffusers_dir(files, tmp_path / "shapes"), storage="float32",
                                compute_dtype=torch.float32)
    prompt = ["a blue triangle at the top right on a black background"]
    text = [encode_prompts(m.text_encoder, m.tokenizer, prompt)[0] for m in (files, folder)]  # (L, 16) each
    assert torch.equal(*text)
    gen = torch.Generator().manual_seed(0)
    c = LATENT_CHANNELS
    latents = torch.randn(1, c, 16, 16, generator=gen)  # (B, C, h, w): a 64x64 picture
    hidden = latents.view(1, c, 8, 2, 8, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, 64, 4 * c)  # packed 2x2
    outs = [m.transformer(hidden_states=hidden, encoder_hidden_states=text[0][None], timestep=torch.tensor([0.5]),
                          img_shapes=[[(1, 8, 8)]], return_dict=False)[0] for m in (files, folder)]
    assert torch.equal(*outs)
    assert torch.equal(decode_latents(files.vae, latents), decode_latents(folder.vae, latents))


@pytest.fixture(scope="module")
def shapes_pictures():  # the shipped model (tests that use it need its weights)
    from trainer_core.families.qwen_image import load_shapes_model
    from trainer_core.devtools.shape_check import ShapePictures

    # 10 sampling steps, half the benchmark's 20: the same 15 colours and places, 9 shapes right where 20 steps draw 8
    # (measured), in 8 s instead of 13.
    return ShapePictures(load_shapes_model(storage="float32", compute_dtype=torch.float32), steps=10)


@needs_weights
def test_shipped_model_draws_what_its_prompts_name(shapes_pictures):
    """One picture per trained shape and colour (15 prompts, seed 0, 10 steps): every one in the named colour at the
    named place, and the named shape in about half (9 measured; 7 leaves room for another BLAS's rounding). The
    benchmark counts 30 prompts x 2 seeds at 20 steps: 58% exactly right (benchmarks/README.md)."""
    from trainer_core.devtools import shapes
    from trainer_core.devtools.shape_check import prior_scenes

    scenes = prior_scenes()[::2]
    right = [shapes.measure(shapes_pictures.picture(s.caption, 0), s.background) for s in scenes]
    assert all((m.colour, m.place) == (s.colour, s.place) for s, m in zip(scenes, right)), right
    hits = sum((m.shape, m.colour, m.place) == (s.shape, s.colour, s.place) for s, m in zip(scenes, right))
    assert hits >= 7, [(s.caption, m) for s, m in zip(scenes, right)]


@needs_weights
def test_the_default_demo_teaches_the_shipped_model_and_writes_it_before_and_after(tmp_path, capsys):
    """`demo` (make demo's command) trains the shipped shapes model on the 8 star pictures and writes the preview
    of the model before training beside the one after (2 of its 200 steps here; benchmarks/shape_concept.py
    measures what 200 teach)."""
    from PIL import Image
    from safetensors.torch import load_file

    from trainer_core.devtools.shapes import STAR_SCENES
    from trainer_core.models.pretrained import NAME, SHAPES_TRANSFORMER
    from trainer_core.runs.cli import SHAPES_MODEL, main

    assert SHAPES_MODEL == NAME  # the command line's name of it (spelled out there: cli imports no torch)
    out = tmp_path / "out"
    assert main(["demo", "--steps", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "model: qwen-image-shapes (qwen-image)" in printed
    for name in ("demo_lora.safetensors", "preview_before.png", "preview.png", "loss.png"):
        assert str(out / name) in printed
    assert Image.open(out / "preview_before.png").size == Image.open(out / "preview.png").size == (256, 256)
    assert sorted(p.read_text().strip() for p in (out / "dataset").glob("*.txt")) == sorted(
        s.caption for s in STAR_SCENES)
    # attention+mlp: 12 Linears a block, 4 of them dead in the last block (qwen_arch.DEAD_IN_LAST_BLOCK); 3 keys each
    blocks = SHAPES_TRANSFORMER["num_layers"]
    assert len(load_file(str(out / "demo_lora.safetensors"))) == 3 * (blocks * 12 - 4)


@needs_weights
def test_the_regularized_shapes_run_file_trains_both_sets(tmp_path, capsys):
    """run_files/shapes_stars_regularized.toml as shipped, 2 steps, its previews off (the step-0 previews, 2 thirds
    of this test's time, are shapes_stars.toml's, checked below): the stars (3 repeats) and the regularisation set
    of known shapes, the set's loss reported on its own."""
    from trainer_core.runs.cli import main

    shipped = (REPO / "run_files" / "shapes_stars_regularized.toml").read_text()
    assert shipped.count('folder = "../example_dataset/') == 2 and shipped.count("preview_every = 50\n") == 1
    config = tmp_path / "shapes_stars_regularized.toml"
    config.write_text(shipped.replace('folder = "../example_dataset/', f'folder = "{REPO / "example_dataset"}/')
                      .replace("preview_every = 50\n", "preview_every = 0\n"))
    out = tmp_path / "out"
    assert main(["train", "--config", str(config), "--output", str(out), "--steps", "2"]) == 0
    printed = capsys.readouterr().out
    assert "shapes_regularization (regularisation)" in printed, printed
    assert (out / "shapes_stars_regularized" / "shapes_stars_regularized_000002.safetensors").is_file()


@needs_weights
def test_the_shapes_run_file_trains_as_shipped(tmp_path, capsys):
    """run_files/shapes_stars.toml (the README's first headless run) as shipped, 2 of its steps: the shapes model
    and the example stars, previews of both its prompts at step 0 (the model before the LoRA) and the LoRA."""
    from trainer_core.runs.cli import main

    out = tmp_path / "out"
    assert main(["train", "--config", str(REPO / "run_files" / "shapes_stars.toml"), "--output", str(out),
                 "--steps", "2"]) == 0
    run = out / "shapes_stars"
    assert {"step_000000_0.png", "step_000000_1.png"} <= {p.name for p in (run / "previews").iterdir()}
    assert (run / "shapes_stars_000002.safetensors").is_file()
    assert "started run 'shapes_stars' at step 0" in capsys.readouterr().out


@pytest.mark.parametrize("folder", ["stars", "shapes_regularization", "stars_on_floor"])
def test_the_example_pictures_are_what_the_shapes_module_draws(tmp_path, folder):
    """example_dataset/stars (the first-run workflow's dataset) holds what `shapes.write_star_dataset` draws,
    example_dataset/shapes_regularization what `regularization_scenes` are and example_dataset/stars_on_floor what
    `write_floor_star_dataset` draws (masks too): the same pixels and captions, so the workflows, the run files and
    `make demo` teach the same thing."""
    import numpy as np
    from PIL import Image

    from trainer_core.devtools.shapes import (regularization_scenes, write_floor_star_dataset, write_pictures,
                                              write_star_dataset)

    fresh = {"stars": lambda f: write_star_dataset(f), "stars_on_floor": lambda f: write_floor_star_dataset(f),
             "shapes_regularization": lambda f: write_pictures(regularization_scenes(), f)}[folder](tmp_path / folder)
    shipped = REPO / "example_dataset" / folder
    names = sorted(p.name for p in fresh.iterdir())
    assert names == sorted(p.name for p in shipped.iterdir())
    assert len(names) == {"stars": 16, "shapes_regularization": 48, "stars_on_floor": 24}[folder]
    for name in names:
        if name.endswith(".png"):
            assert np.array_equal(np.asarray(Image.open(fresh / name)), np.asarray(Image.open(shipped / name))), name
        else:
            assert (fresh / name).read_text() == (shipped / name).read_text(), name


def test_the_masked_run_file_trains_the_star_and_leaves_the_floor_out():
    """run_files/shapes_stars_masked.toml parses, and its dataset loads as 8 stars on the yellow floor band, each
    with its mask: on the latent grid the loss weighs 0 (mask_background_weight) on the floor band, which the
    captions never name, and 1 on the star and the plain background above the band."""
    import torch

    from trainer_core.data.images import load_dataset
    from trainer_core.data.masks import loss_weights
    from trainer_core.devtools import shapes
    from trainer_core.runs.run_file import read_run_file

    run, _ = read_run_file(REPO / "run_files" / "shapes_stars_masked.toml")
    (cfg,) = run.datasets
    assert cfg.mask_background_weight == 0.0 and cfg.folder == str(REPO / "example_dataset" / "stars_on_floor")
    dataset = load_dataset(cfg)
    assert len(dataset.samples) == 8 and all(s.mask is not None for s in dataset.samples)
    factor = 4  # the shapes model's VAE
    grid = (shapes.SIZE // factor, shapes.SIZE // factor)
    for sample in dataset.samples:
        assert "floor" not in sample.caption and "star" in sample.caption
        weights = loss_weights(sample.mask, (shapes.SIZE, shapes.SIZE), (shapes.SIZE, shapes.SIZE), grid)  # (16, 16)
        floor = shapes.FLOOR_TOP // factor  # latent row 13 holds pixel rows 52..55: half floor
        assert torch.equal(weights[floor + 1:], torch.zeros(2, 16))
        assert torch.equal(weights[floor], torch.full((16,), 0.5))
        assert torch.equal(weights[:floor], torch.ones(floor, 16))


def test_the_dop_run_file_preserves_known_circle_prompts():
    """run_files/shapes_stars_dop.toml parses: trigger "star", class word "circle" (a shape the shapes model was
    trained on), so every star caption's class caption is a prompt of the model's own training vocabulary."""
    from trainer_core.data.images import load_dataset
    from trainer_core.data.preservation import class_captions
    from trainer_core.devtools import shapes
    from trainer_core.runs.run_file import read_run_file

    run, _ = read_run_file(REPO / "run_files" / "shapes_stars_dop.toml")
    assert (run.cache.preservation_trigger, run.cache.preservation_class) == ("star", "circle")
    assert run.train.preservation_weight == 1.0
    (cfg,) = run.datasets
    samples = load_dataset(cfg).samples
    known = set(shapes.all_captions())
    assert len(samples) == 8 and all(c in known for c in class_captions(samples, "star", "circle"))
