"""The standalone command line: `python -m trainer_core demo|export-tiny`, called in process through
`cli.main` (a new process costs its imports, 5-25 s; `python -m trainer_core` itself runs in a new
process in test_resume.py)."""

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file


def test_demo_writes_lora_preview_and_loss_plot(tmp_path, capsys):
    from trainer_core.runs.cli import main

    assert main(["demo", "--model", "qwen-image", "--steps", "6", "--out", str(tmp_path / "out")]) == 0
    stdout = capsys.readouterr().out
    out = tmp_path / "out"
    for name in ("demo_lora.safetensors", "preview_before.png", "preview.png", "loss.png"):
        assert str(out / name) in stdout
    assert len(load_file(str(out / "demo_lora.safetensors"))) == 3 * (2 * 14 - 4)
    assert Image.open(out / "preview.png").size == (256, 256)
    assert Image.open(out / "loss.png").size == (768, 384)
    assert "loss: first step" in stdout


def test_a_training_process_imports_the_engine_with_its_objects_frozen_and_collection_back_on():
    """`runs.startup.load_engine` (what `demo` and `train` call first): the engine and its libraries imported, their
    objects in the collector's permanent generation (later full collections skip them), the collector enabled."""
    import gc
    import sys

    from trainer_core.runs.startup import load_engine

    gc.unfreeze()  # this test process froze them already (conftest): start from none
    assert gc.get_freeze_count() == 0
    load_engine()
    assert gc.isenabled()
    assert gc.get_freeze_count() > 100_000  # every module, class and function alive (~500k with these libraries)
    assert {"diffusers", "transformers", "peft", "trainer_core.training", "trainer_core.runs.headless"} <= set(sys.modules)


def test_cli_help_lists_commands(capsys):
    from trainer_core.runs.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "demo" in capsys.readouterr().out


def test_export_tiny_writes_a_diffusers_folder_that_loads(tmp_path, capsys):
    from trainer_core.runs.cli import main
    from trainer_core.families.qwen_image import load_diffusers_dir

    assert main(["export-tiny", str(tmp_path / "tiny"), "--layout", "diffusers"]) == 0
    assert f"diffusers_folder: {tmp_path / 'tiny'}" in capsys.readouterr().out
    assert load_diffusers_dir(tmp_path / "tiny", storage="float32", compute_dtype=torch.float32).num_blocks == 2


def test_demo_trains_from_single_files(tiny_files, tmp_path, capsys):
    """`demo --transformer --text-encoder --vae` (the files `export-tiny` writes in ComfyUI's layouts)."""
    from trainer_core.runs.cli import main

    code = main(["demo", "--model", "qwen-image", "--steps", "1", "--out", str(tmp_path / "out"),
                 "--transformer", str(tiny_files["transformer_fp8_e4m3fn"]),
                 "--text-encoder", str(tiny_files["text_encoder_fp8_scaled"]), "--vae", str(tiny_files["vae"]),
                 "--text-encoder-fp8", "keep"])
    out = capsys.readouterr().out
    assert code == 0 and "model: qwen_image_tiny_fp8_e4m3fn" in out
    lora = load_file(str(tmp_path / "out" / "demo_lora.safetensors"))
    assert len(lora) == 3 * (2 * 14 - 4)
    assert main(["demo", "--transformer", str(tiny_files["vae"]), "--text-encoder", str(tiny_files["vae"]),
                 "--vae", str(tiny_files["vae"])]) == 2  # a wrong file: the message, not a traceback
    assert "is not a Qwen-Image transformer" in capsys.readouterr().err


# Bad values of every flag: one line `error: ...` naming the flag, exit code 2, no traceback.
# (argv, text the message must contain); `FILE` is replaced by the path of an existing plain file.
BAD_INPUTS = [
    (["plan", "--blocks-to-swap", "70"], "--blocks-to-swap 70: Qwen-Image has 60 transformer blocks"),
    (["plan", "--blocks-to-swap", "-2"], "argument --blocks-to-swap: -2 must be from -1"),
    (["plan", "--blocks-to-swap", "many"], "argument --blocks-to-swap: blocks_to_swap='many' is not a number"),
    (["plan", "--resolution", "0"], "argument --resolution: 0 must be from 64"),
    (["plan", "--width", "0"], "argument --width: 0 must be from 32"),
    (["plan", "--height", "-64"], "argument --height: -64 must be from 32"),
    (["plan", "--width", "1000"], "argument --width: 1000 must be a multiple of 32"),
    (["plan", "--resolution", "1000"], "argument --resolution: 1000 must be a multiple of 32"),
    (["plan", "--rank", "0"], "argument --rank: 0 must be from 1 to 512"),
    (["plan", "--rank", "sixteen"], "argument --rank: 'sixteen' is not a whole number"),
    (["plan", "--budget-gb", "0"], "argument --budget-gb: 0 must be from 1.0"),
    (["plan", "--budget-gb", "-8"], "argument --budget-gb: -8 must be from 1.0"),
    (["plan", "--budget-gb", "nan"], "argument --budget-gb: nan must be a finite number"),
    (["plan", "--batch", "0"], "argument --batch: 0 must be from 1"),
    (["plan", "--grad-accum", "-1"], "argument --grad-accum: -1 must be from 1"),
    (["plan", "--text-tokens", "-1"], "argument --text-tokens: -1 must be from 0"),
    (["plan", "--images", "-5"], "argument --images: -5 must be from 0"),
    (["plan", "--storage", "float32"], "argument --storage: invalid choice: 'float32'"),
    (["plan", "--targets", "everything"], "argument --targets: invalid choice"),
    (["plan", "--lora-dtype", "float16"], "argument --lora-dtype: invalid choice"),
    (["plan", "--optimizer", "sgd"], "argument --optimizer: invalid choice"),
    (["plan", "--text-encoder-storage", "int4"], "argument --text-encoder-storage: invalid choice"),
    (["plan", "--bogus"], "unrecognized arguments: --bogus"),
    (["demo", "--steps", "-3"], "argument --steps: -3 must be from 1"),
    (["demo", "--steps", "0"], "argument --steps: 0 must be from 1"),
    (["demo", "--seed", "-1"], "argument --seed: -1 must be from 0"),
    (["demo", "--blocks-to-swap", "-7"], "argument --blocks-to-swap: -7 must be from -1"),
    (["demo", "--blocks-to-swap", "5"], "--blocks-to-swap 5: the transformer has 4 blocks"),  # the shapes model's
    (["demo", "--model", "qwen-image", "--blocks-to-swap", "2"], "--blocks-to-swap 2: the transformer has 2 blocks"),
    (["demo", "--out", "FILE/sub"], "--out FILE/sub: cannot write there"),
    (["demo", "--transformer", "FILE/missing.safetensors"], "argument --transformer: 'FILE/missing.safetensors' is not "
                                                           "an existing file"),
    (["demo", "--transformer", "FILE"], "needs all three of --transformer, --text-encoder and --vae"),
    (["demo", "--tokenizer", "FILE"], "argument --tokenizer: 'FILE' is not an existing folder"),
    (["demo", "--text-encoder-fp8", "drop"], "argument --text-encoder-fp8: invalid choice"),
    (["export-tiny", "FILE/sub"], "dir FILE/sub: cannot write there"),
    (["export-tiny", "out", "--seed", "x"], "argument --seed: 'x' is not a whole number"),
    (["export-tiny", "out", "--layout", "kohya"], "argument --layout: invalid choice"),
    ([], "the following arguments are required: command"),
]


@pytest.mark.parametrize("argv, message", BAD_INPUTS, ids=[" ".join(a) or "(none)" for a, _ in BAD_INPUTS])
def test_bad_flag_values_give_one_line_and_exit_2(argv, message, tmp_path, capsys, monkeypatch):
    from trainer_core.runs.cli import main

    monkeypatch.chdir(tmp_path)  # demo's --out defaults to demo_out in the working folder

    plain_file = tmp_path / "plain.txt"
    plain_file.write_text("not a folder")
    argv = [a.replace("FILE", str(plain_file)) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert message.replace("FILE", str(plain_file)) in err, err
    assert not captured.out  # refused before any work
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt"]  # and leaves no folder behind (no demo_out)


def test_plan_flags_come_from_the_config():
    """Choices, defaults and help of `plan`'s flags are the config fields' (nothing listed by hand)."""
    from trainer_core.runs.cli import build_parser
    from trainer_core.core.config import LoraConfig, OptimizerConfig, PlanConfig, TrainConfig, choices, help_text

    plan = build_parser()._subparsers._group_actions[0].choices["plan"]
    flags = {a.option_strings[0]: a for a in plan._actions if a.option_strings}
    for flag, cls, name in (("--rank", LoraConfig, "rank"), ("--targets", LoraConfig, "targets"),
                            ("--lora-dtype", LoraConfig, "dtype"), ("--storage", PlanConfig, "storage"),
                            ("--optimizer", OptimizerConfig, "optimizer"), ("--batch", TrainConfig, "micro_batch_size"),
                            ("--grad-accum", TrainConfig, "grad_accum_steps"),
                            ("--text-tokens", PlanConfig, "text_tokens"),
                            ("--checkpointing", TrainConfig, "gradient_checkpointing")):
        action = flags[flag]
        assert action.default == getattr(cls(), name), flag
        assert action.help.startswith(help_text(cls, name)), flag
        if action.choices is not None:
            assert tuple(action.choices) == choices(cls, name), flag


def test_plan_accepts_auto_and_a_swap_count_with_a_budget(capsys):
    from trainer_core.runs.cli import main

    assert main(["plan", "--blocks-to-swap", "auto", "--budget-gb", "16"]) == 0
    assert "blocks_to_swap = " in capsys.readouterr().out
    assert main(["plan", "--blocks-to-swap", "59", "--budget-gb", "16", "--width", "512", "--height", "768"]) == 0
    assert "blocks_to_swap 59" in capsys.readouterr().out


def test_plan_says_how_many_blocks_recompute_as_a_run_would(capsys):
    """The plan command's 'auto' checkpointing is the run's choice (planner.for_run.check_run) at the same budget."""
    from trainer_core.planner import GIB, PlanInputs
    from trainer_core.planner.for_run import check_run
    from trainer_core.runs.cli import main

    from trainer_core.families import get_family

    family = get_family("qwen-image")  # the command's defaults: Qwen-Image at 1024x1024, rank 16, its file parts
    run = check_run(PlanInputs(width=1024, height=1024, rank=16, device="cuda"), True, 48 * GIB, None,
                    family.planned_arch(), family.planned_parts(text_encoder_file=True), auto_checkpointing=True)
    assert 0 < run.checkpointed_blocks < 60
    assert main(["plan", "--budget-gb", "48"]) == 0
    out = capsys.readouterr().out
    assert run.checkpointing_note in out
    assert main(["plan", "--budget-gb", "48", "--checkpointing", "on"]) == 0
    assert "recompute (auto" not in capsys.readouterr().out
    assert main(["plan", "--budget-gb", "48", "--no-checkpointing"]) == 0
    assert "checkpointing off" in capsys.readouterr().out


def test_demo_with_automatic_block_swapping(tmp_path, capsys):
    from trainer_core.runs.cli import main

    assert main(["demo", "--model", "qwen-image", "--steps", "1", "--blocks-to-swap", "auto",
                 "--out", str(tmp_path / "out")]) == 0
    assert "loss: first step" in capsys.readouterr().out
    assert (tmp_path / "out" / "demo_lora.safetensors").is_file()
