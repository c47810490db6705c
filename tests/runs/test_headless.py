"""`python -m trainer_core train`: run files, the shipped tiny example, resume by re-running, Ctrl-C, the
settings template, and diffusion-pipe configs. In this process through `cli.main` (torchrun runs are in
test_distributed.py)."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import tomllib
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from conftest import REPO, TESTS

EXAMPLE = REPO / "run_files" / "tiny_run.toml"
DP_DATA = TESTS / "data" / "diffusion_pipe"
# A LoRA of rank r on "all" targets of the tiny model: 14 Linears in each of 2 blocks, minus the last block's
# 4 dead ones, each with lora_A, lora_B and alpha.
TINY_ALL_KEYS = 3 * (2 * 14 - 4)


def tiny_run_file(folder: Path, images: Path, **tables) -> Path:
    """A small run file for the tiny model on the images in `images`; `tables` add or replace settings ({table: {key: v}})."""
    from trainer_core.runs.run_file_toml import render

    data = {
        "model": {"source": "tiny", "storage": "float32"},
        "dataset": [{"folder": str(images), "resolution": 64, "min_bucket_side": 32, "max_bucket_side": 128}],
        "lora": {"rank": 4, "alpha": 4.0},
        "optimizer": {"learning_rate": 1e-3},
        "train": {"run_name": "t", "steps": 6, "micro_batch_size": 2, "blocks_to_swap": 0,
                  "gradient_checkpointing": False, "seed": 1},
    }
    for table, values in tables.items():
        if table == "dataset":
            data["dataset"] = values
        else:
            data.setdefault(table, {}).update(values)
    path = folder / "run.toml"
    folder.mkdir(parents=True, exist_ok=True)
    from trainer_core.runs.run_file import TABLES
    from trainer_core.runs.run_file_toml import toml_value

    extra = "".join(f"\n[{table}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items())
                    for table, values in data.items() if table not in TABLES)  # render writes known tables only
    path.write_text(render(data) + extra)
    return path


def same_tensors(a: Path, b: Path) -> bool:
    ta, tb = load_file(str(a)), load_file(str(b))
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


@pytest.mark.slow
def test_the_shipped_tiny_example_trains_and_running_it_again_resumes(tmp_path, capsys):
    """run_files/tiny_run.toml as shipped (the README's first headless command), into another output folder."""
    from trainer_core.runs.cli import main

    out = tmp_path / "out"
    first = ["train", "--config", str(EXAMPLE), "--output", str(out), "--steps", "50"]  # of its 200 (time)
    assert main(first) == 0
    printed = capsys.readouterr().out
    run = out / "tiny_first_run"
    lora = run / "tiny_first_run_000050.safetensors"
    assert f"lora: {lora}" in printed and "started run 'tiny_first_run' at step 0" in printed
    assert len(load_file(str(lora))) == TINY_ALL_KEYS
    assert sorted(p.name for p in (run / "previews").iterdir()) == [
        f"step_{s:06d}_0.png" for s in (0, 50)] + ["steps.png"]
    losses = json.loads((run / "losses.json").read_text())["loss"]
    assert len(losses) == 50 and losses[-1][1] < 0.8 * losses[0][1]  # 1.41 -> 1.03 at step 50, 0.30 at 200
    assert (run / "config.toml").read_text() == EXAMPLE.read_text()
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000050"]

    assert main(first) == 0  # the same command again: the run is there already
    assert "is at step 50 already" in capsys.readouterr().out
    assert main(first[:-1] + ["53"]) == 0
    printed = capsys.readouterr().out
    assert "resumed run 'tiny_first_run' from its checkpoint at step 50" in printed
    assert (run / "tiny_first_run_000053.safetensors").is_file()


@pytest.mark.slow
def test_ctrl_c_stops_at_a_step_boundary_and_the_same_command_continues_bit_exactly(tmp_path, demo_folder, capsys):
    """SIGINT during training: the run stops after the step it is in, with a checkpoint and the LoRA of that step
    (exit code 130); the same command then trains on, to the LoRA an uninterrupted run makes."""
    from trainer_core.training.distributed import ONE_PROCESS
    from trainer_core.runs.headless import STOPPED, train_run
    from trainer_core.runs.run_file import read_run_file

    snapshots = {"output": {"snapshot_every": 2}}
    whole, _ = read_run_file(tiny_run_file(tmp_path / "whole", demo_folder, **snapshots))
    split, text = read_run_file(tiny_run_file(tmp_path / "split", demo_folder, **snapshots))
    assert train_run(whole, ONE_PROCESS) == 0

    def press_ctrl_c(report):
        if report.step == 3:
            signal.raise_signal(signal.SIGINT)

    # What was there before (Python's default_int_handler, or SIG_IGN where the suite runs as a background job:
    # a shell starts those with SIGINT ignored) must be there after.
    before = signal.getsignal(signal.SIGINT)
    assert train_run(split, ONE_PROCESS, text, on_step=press_ctrl_c) == STOPPED
    printed = capsys.readouterr().out
    assert "SIGINT: stopping after this step" in printed and "stopped at step 4" in printed
    assert signal.getsignal(signal.SIGINT) is before  # the handler was taken down again
    run = split.run_dir
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == 4
    assert (run / "t_000004.safetensors").is_file() and not (run / "t_000006.safetensors").exists()
    assert train_run(split, ONE_PROCESS, text) == 0
    assert "resumed run 't' from its checkpoint at step 4" in capsys.readouterr().out
    for step in (2, 4, 6):
        assert same_tensors(run / f"t_{step:06d}.safetensors", whole.run_dir / f"t_{step:06d}.safetensors"), step


def test_a_run_file_on_model_files_trains_and_previews(tmp_path, demo_folder, tiny_files, capsys):
    """The files ComfyUI users have (here the tiny model's, as export-tiny writes them: float8 transformer, scaled
    fp8 text encoder, VAE, a tokenizer folder beside them), named relative to the run file."""
    from trainer_core.runs.cli import main

    root = Path(tiny_files["vae"]).parents[1]
    model = {"transformer": str(Path(tiny_files["transformer_fp8_e4m3fn"]).relative_to(root)),
             "text_encoder": str(Path(tiny_files["text_encoder_fp8_scaled"]).relative_to(root)),
             "vae": str(Path(tiny_files["vae"]).relative_to(root)), "source": ""}
    path = tiny_run_file(root, demo_folder, model=model, train={"steps": 2},  # beside the model folders
                         previews={"preview_prompts": ["a red circle", "a blue square"], "preview_every": 2,
                                   "preview_size": 64, "preview_sampling_steps": 2})
    assert main(["train", "--config", str(path), "--output", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "model: qwen_image_tiny_fp8_e4m3fn" in printed
    run = tmp_path / "out" / "t"
    assert sorted(p.name for p in (run / "previews").glob("step_*")) == [
        "step_000000_0.png", "step_000000_1.png", "step_000002_0.png", "step_000002_1.png"]
    assert len(load_file(str(run / "t_000002.safetensors"))) == 3 * (2 * 12 - 4)  # attention+mlp: 12 a block
    # The first prompt's previews, measured against the untrained one and the previous one (live.PreviewMovement)
    from trainer_core.training.live import image_difference

    moved = json.loads((run / "losses.json").read_text())["preview_movement"]
    first, last = (Image.open(run / "previews" / f"step_00000{s}_0.png") for s in (0, 2))
    assert moved[0] == [0, 0.0, None]
    assert moved[1] == [2, image_difference(last, first), image_difference(last, first)]


def test_several_dataset_folders_each_with_its_repeats_and_an_epoch_length(tmp_path, demo_folder, capsys):
    """Two [[dataset]] tables (the same folder at two resolutions, repeats 1 and 2) make one data order in which
    every epoch holds each sample its folder's repeats times; epochs = 2 ends the run after two of them."""
    from trainer_core.training.distributed import ONE_PROCESS
    from trainer_core.runs.headless import cache_once, open_once, run_length
    from trainer_core.runs.run_file import read_run_file
    from trainer_core.runs.registry import release

    entries = [{"folder": str(demo_folder), "resolution": 64, "min_bucket_side": 32, "max_bucket_side": 128},
               {"folder": str(demo_folder), "resolution": 96, "min_bucket_side": 32, "max_bucket_side": 192, "upscale_small_images": True,
                "repeats": 2}]
    run, _ = read_run_file(tiny_run_file(tmp_path, demo_folder, dataset=entries,
                                         train={"steps": 0, "epochs": 2, "grad_accum_steps": 3}))
    from trainer_core.families.loading import LoadRequest, load_model_set

    components = load_model_set(LoadRequest("tiny test model (random weights)", torch.device("cpu"), storage="float32"))
    cached = cache_once(components, run, ONE_PROCESS, print)
    trainer = open_once(components, cached, run, run.run_dir, ONE_PROCESS, print)
    try:
        assert cached.repeats == (1,) * 8 + (2,) * 8
        epoch = [i for batch in trainer.built.order.epoch_plan(0) for i in batch]
        assert sorted(epoch) == sorted(list(range(16)) + list(range(8, 16)))
        end, per_epoch = run_length(trainer, run, None)
        batches = len(trainer.built.order.epoch_plan(0))
        assert per_epoch == batches / 3 and end == -(-2 * batches // 3)
    finally:
        release("t")


def test_help_config_prints_every_setting_with_its_help_and_default(capsys):
    from trainer_core.runs.cli import main
    from trainer_core.runs.run_file import KEYS, TABLES

    assert main(["train", "--help-config"]) == 0
    text = capsys.readouterr().out
    template = tomllib.loads(text)  # the template is itself TOML
    # [edit] makes a run an Edit one: the template shows it commented out
    assert list(template) == [t for t in TABLES if t != "edit"] and "\n# [edit]\n" in text
    comments = re.sub(r"\n# ", " ", text)  # help texts are wrapped over comment lines
    for key in KEYS:
        if key.table == "edit":
            assert f"\n# {key.name} = " in text, key.name
        else:
            table = template[key.table][0] if key.table == "dataset" else template[key.table]
            assert key.name in table, (key.table, key.name)
        assert key.help_text in comments, (key.table, key.name)
    from trainer_core.core import config

    shown = {(k.cls, k.field) for k in KEYS}
    for cls in (config.LoadConfig, config.LoraConfig, config.OptimizerConfig, config.TrainConfig,
                config.HeadlessConfig, config.DatasetConfig):
        for f in dataclasses.fields(cls):
            assert (cls, f.name) in shown or f.name == "input_folder", (cls.__name__, f.name)  # ComfyUI's only
    assert template["train"]["blocks_to_swap"] == "auto" and template["lora"]["rank"] == 16


BAD_RUN_FILES = [
    ({"trian": {"steps": 3}}, "unknown table [trian] (did you mean 'train'?)"),
    ({"train": {"step": 3}}, "[train] has no setting 'step' (did you mean 'steps'?)"),
    ({"train": {"micro_batch_size": 0}}, "[train] micro_batch_size = 0 must be from 1 to 64"),
    ({"train": {"micro_batch_size": 1.5}}, "[train] micro_batch_size = 1.5 must be a whole number, not a number"),
    ({"train": {"blocks_to_swap": "many"}}, "blocks_to_swap='many' is not a number"),
    ({"train": {"blocks_to_swap": 5}}, "blocks_to_swap=5 is too large: the transformer has 2 blocks"),
    ({"train": {"steps": 0}}, "[train] steps and epochs are both 0"),
    ({"lora": {"targets": "everything"}}, "[lora] targets = \"everything\" must be one of attention"),
    ({"optimizer": {"learning_rate": "1e-4"}}, "[optimizer] learning_rate = \"1e-4\" must be a number, not a text"),
    ({"model": {"source": "", "transformer": "missing.safetensors"}}, "reads model files but text_encoder, vae are "
                                                                       "not set"),
    ({"model": {"source": "sdxl"}}, "[model] source = \"sdxl\" must be one of"),
    ({"dataset": [{"resolution": 64}]}, "[[dataset]] needs folder"),
    ({"dataset": [{"folder": "x", "resolution": 100}]}, "resolution = 100 must be a multiple of 32"),
    ({"dataset": [{"folder": "no_such_folder"}]}, "no_such_folder"),
    ({"previews": {"preview_every": 5}}, "preview_every = 5 needs preview_prompts"),
    ({"output": {"filename": "{epoch}"}}, "has the placeholder {epoch}"),
    ({"lora": {"continue_from_lora": "nothing.safetensors"}}, "is not a file"),
]


@pytest.mark.parametrize("tables, message", BAD_RUN_FILES, ids=[m[:40] for _, m in BAD_RUN_FILES])
def test_a_bad_run_file_gives_one_line_naming_the_setting_and_exit_2(tables, message, tmp_path, demo_folder, capsys):
    from trainer_core.runs.cli import main

    path = tiny_run_file(tmp_path, demo_folder, **tables)
    assert main(["train", "--config", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert message in err, err
    assert not (tmp_path / "out" / "t" / "checkpoints").exists()


# ------------------------------------------------------------------------------------------------------------
# diffusion-pipe

def diffusion_pipe_copy(folder: Path, model: dict[str, str], images: Path, edits: dict[str, str] | None = None) -> Path:
    """The reconstructed 24 GB example and dataset file in `folder`, its paths pointed at `model` (diffusion-pipe
    [model] keys -> paths) and `images`; `edits` replace whole lines (a regular expression -> the new lines)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = (DP_DATA / "qwen_image_24gb_vram.toml").read_text()
    text = text.replace("'/path/to/output'", repr(str(folder / "output")))
    text = text.replace("'/path/to/dataset.toml'", repr(str(folder / "dataset.toml")))
    text = text.replace("diffusers_path = '/path/to/diffusers/Qwen-Image'",
                        "\n".join(f"{k} = {str(v)!r}" for k, v in model.items()))
    for pattern, lines in (edits or {}).items():
        text, found = re.subn(rf"(?m)^{pattern}$", lines, text)
        assert found == 1, pattern
    (folder / "dataset.toml").write_text((DP_DATA / "dataset.toml").read_text().replace(
        "'/home/anon/data/images/grayscale'", repr(str(images))))
    (folder / "config.toml").write_text(text)
    return folder / "config.toml"


def test_every_field_of_the_diffusion_pipe_example_is_mapped_or_ignored_with_a_reason(tmp_path, demo_folder):
    from trainer_core.runs.diffusion_pipe import translate

    config = diffusion_pipe_copy(tmp_path, {"diffusers_path": tmp_path / "Qwen-Image"}, demo_folder)
    t = translate(config)
    data = tomllib.loads(t.text)  # what is printed is a run file
    assert data == {table: value for table, value in t.data.items()}
    assert data["model"] == {"diffusers_folder": str(tmp_path / "Qwen-Image"), "storage": "float8",
                             "compute_dtype": "auto"}
    assert data["dataset"] == [{"folder": str(demo_folder), "resolution": 512, "enable_buckets": True,
                                "min_bucket_side": 352, "max_bucket_side": 736, "repeats": 1,
                                "missing_caption": "error", "upscale_small_images": True}]
    assert data["lora"] == {"rank": 32, "alpha": 32.0, "targets": "all", "dtype": "float32"}
    # automagic runs as automagic, from its published starting rate; a float32 LoRA stands in for its Kahan sum
    assert data["optimizer"] == {"optimizer": "automagic", "learning_rate": 1e-6, "weight_decay": 0.01,
                                 "max_grad_norm": 1.0}
    assert data["train"] == {"run_name": "qwen_lora", "micro_batch_size": 1, "grad_accum_steps": 4,
                             "gradient_checkpointing": "on", "blocks_to_swap": "auto",
                             "timestep_sampling": "logit_normal", "resolution_shift": False, "steps": 0, "epochs": 1000}
    assert data["cache"] == {"caching_batch_size": 8}
    assert data["output"] == {"folder": str(tmp_path / "output"), "filename": "{run_name}_{step}",
                              "dtype": "bfloat16", "layout": "comfyui", "snapshot_every_epochs": 5}
    ignored = {what.split(" = ")[0]: why for what, why in t.ignored}
    assert "torchrun --nproc-per-node" in ignored["pipeline_stages"]
    assert "automagic (automagic.py" in t.comments[("optimizer", "optimizer")]
    # Every field of both files is accounted for: mapped onto a key, checked, or ignored with its reason.
    main, dataset = tomllib.loads(config.read_text()), tomllib.loads((tmp_path / "dataset.toml").read_text())
    fields = {f"{table}.{k}" for table in ("model", "adapter", "optimizer") for k in main[table]}
    fields |= {k for k in main if k not in ("model", "adapter", "optimizer")}
    fields |= {f"dataset.{k}" for k in dataset if k != "directory"}
    fields |= {f"directory[1].{k}" for k in dataset["directory"][0]}
    assert set(t.accounted) == fields
    assert {how for how in t.accounted.values()} == {"mapped", "checked", "ignored"}
    for name, how in t.accounted.items():
        if how == "ignored":
            assert any(what.startswith((name, name.replace("dataset.", "dataset: "))) for what in ignored), name


def test_diffusion_pipe_model_files_other_optimizers_and_what_cannot_be_translated(tmp_path, demo_folder):
    from trainer_core.runs.diffusion_pipe import translate
    from trainer_core.core.errors import UserInputError

    files = {"transformer_path": "t.safetensors", "text_encoder_path": "te.safetensors", "vae_path": "v.safetensors",
             "diffusers_path": str(tmp_path / "Qwen-Image")}
    (tmp_path / "Qwen-Image" / "tokenizer").mkdir(parents=True)
    config = diffusion_pipe_copy(tmp_path, files, demo_folder, {
        "type = 'automagic'": "type = 'AdamW8bitKahan'\nlr = 2e-5\nbetas = [0.9, 0.99]",
        "#warmup_steps = 100": "warmup_steps = 100", "blocks_to_swap = 8": "lr_scheduler = 'cosine'\nmax_steps = 500"})
    t = translate(config, cwd=tmp_path)
    assert t.data["model"]["source"] == "files"
    assert t.data["model"]["transformer"] == str(tmp_path / "t.safetensors")  # relative: from the working directory
    assert t.data["model"]["tokenizer"] == str(tmp_path / "Qwen-Image" / "tokenizer")
    assert t.data["optimizer"] == {"optimizer": "adamw_kahan", "learning_rate": 2e-5, "beta1": 0.9, "beta2": 0.99,
                                   "weight_decay": 0.01, "max_grad_norm": 1.0, "warmup_steps": 100,
                                   "schedule": "cosine", "schedule_steps": 500, "min_lr_ratio": 1e-6 / 2e-5}
    assert "Kahan summation" in t.comments[("optimizer", "optimizer")]
    assert t.data["lora"]["dtype"] == "bfloat16"  # Kahan summation keeps the bf16 weights' small updates here too
    for kind, ours, lr in (("adamw_optimi", "adamw_kahan", 2e-5), ("Prodigy", "prodigy", 1.0)):
        edits = {"type = 'automagic'": f"type = '{kind}'" + ("\nlr = 2e-5" if lr != 1.0 else "")}
        other = translate(diffusion_pipe_copy(tmp_path / kind, files, demo_folder, edits), cwd=tmp_path)
        assert (other.data["optimizer"]["optimizer"], other.data["optimizer"]["learning_rate"]) == (ours, lr), kind
        assert other.data["lora"]["dtype"] == "bfloat16", kind
    assert t.data["train"]["steps"] == 500 and "blocks_to_swap" not in t.data["train"]

    no_vae = {k: v for k, v in files.items() if k != "vae_path"}
    for model, edit, message in ((files, {"type = 'qwen_image'": "type = 'flux'"}, "this trainer trains Qwen-Image"),
                                 (files, {"type = 'lora'": "type = 'lokr'"}, "only 'lora' trains here"),
                                 (no_vae, {}, "Give all three model files, or only diffusers_path")):
        with pytest.raises(UserInputError, match=re.escape(message)):
            translate(diffusion_pipe_copy(tmp_path / "bad", model, demo_folder, edit), cwd=tmp_path)


def test_the_diffusion_pipe_24gb_example_trains_on_tiny_files(tmp_path, demo_folder, capsys):
    """The example as given, its model path pointed at the tiny model written as a diffusers folder and its
    dataset at one image: it prints the translation and trains (one step here: the example runs 1000 epochs; one
    image, because the tiny VAE takes seconds per image at the example's 512 px on a CPU)."""
    import shutil

    from trainer_core.runs.cli import main
    from trainer_core.families import get_family

    images = tmp_path / "images"
    images.mkdir()
    for name in ("00_red_circle.png", "00_red_circle.txt"):
        shutil.copy(demo_folder / name, images / name)
    get_family("qwen-image").export_tiny(tmp_path / "Qwen-Image", layout="diffusers")
    config = diffusion_pipe_copy(tmp_path, {"diffusers_path": tmp_path / "Qwen-Image"}, images)
    assert main(["train", "--from-diffusion-pipe", str(config), "--steps", "1"]) == 0
    printed = capsys.readouterr().out
    translated = printed[:printed.index("\nmodel: ") + 1]
    assert tomllib.loads(translated)["lora"]["rank"] == 32
    lora = tmp_path / "output" / "qwen_lora" / "qwen_lora_000001.safetensors"
    assert f"lora: {lora}" in printed
    weights = load_file(str(lora))
    assert weights["diffusion_model.transformer_blocks.0.attn.to_q.lora_A.weight"].shape[0] == 32
    assert (tmp_path / "output" / "qwen_lora" / "config.toml").read_text() == translated
