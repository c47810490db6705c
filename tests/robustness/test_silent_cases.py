"""Cases that used to go on without a word and lose work or train nothing (issue 25): each now stops with a
message naming the input, or says what it did."""

import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from trainer_core.core.errors import UserInputError
from trainer_core.core.finite import has_nonfinite
from trainer_core.families.qwen_image import load_single_files


def copies_of(tiny_files, tmp_path, names):
    out = {}
    for name in names:
        out[name] = tmp_path / tiny_files[name].name
        shutil.copy(tiny_files[name], out[name])
        sidecar = tiny_files[name].with_suffix(".json")
        if sidecar.is_file():
            shutil.copy(sidecar, out[name].with_suffix(".json"))
    return out


def damage_one_weight(path, pick, value):
    """Put `value` into one element of the first tensor (sorted by name) for which pick(name, tensor)."""
    tensors = load_file(str(path))
    name = sorted(k for k, t in tensors.items() if pick(k, t))[0]
    tensor = tensors[name].clone()
    if tensor.dtype == torch.float8_e4m3fn:
        tensor.view(torch.uint8).view(-1)[1] = value  # a raw byte: 0x7F is +NaN, 0xFF is -NaN
    else:
        tensor.view(-1)[1] = value
    tensors[name] = tensor
    save_file(tensors, str(path))
    return name


def fp8_weight(name, tensor):
    return tensor.dtype == torch.float8_e4m3fn


def floating(name, tensor):  # (not the vision tower nor lm_head: a text-to-image model never reads them)
    return tensor.is_floating_point() and tensor.numel() > 1 and not name.startswith(("visual.", "lm_head"))


@pytest.mark.parametrize("transformer, part, pick, value", [
    ("transformer_bf16", "transformer_bf16", floating, float("nan")),
    ("transformer_bf16", "transformer_bf16", floating, float("-inf")),
    ("transformer_fp8_e4m3fn", "transformer_fp8_e4m3fn", fp8_weight, 0x7F),
    ("transformer_fp8_e4m3fn", "transformer_fp8_e4m3fn", fp8_weight, 0xFF),
    ("transformer_bf16", "text_encoder_bf16", floating, float("inf")),
    ("transformer_bf16", "vae", floating, float("nan")),
], ids=["bf16 NaN", "bf16 -inf", "fp8 +NaN", "fp8 -NaN", "text encoder inf", "VAE NaN"])
def test_a_model_file_with_a_nan_or_inf_weight_is_refused_naming_the_file_and_tensor(tiny_files, tmp_path, transformer,
                                                                                    part, pick, value):
    """Before: it loaded without a word; a base that computes NaN only ever skips steps."""
    files = copies_of(tiny_files, tmp_path, (transformer, "text_encoder_bf16", "vae"))
    bad = damage_one_weight(files[part], pick, value)
    with pytest.raises(UserInputError) as refused:
        components = load_single_files(files[transformer], files["text_encoder_bf16"], files["vae"],
                                       tokenizer_dir=tiny_files["tokenizer"], storage="float32",
                                       compute_dtype=torch.float32)
        components.ensure_transformer(torch.device("cpu"))
        components.ensure_text_encoder()
        components.ensure_vae()
    message = str(refused.value)
    assert str(files[part]) in message and "tensor " in message
    if part.startswith("transformer"):  # (the text encoder's and VAE's are named as the model names them)
        assert f"tensor {bad} " in message
    assert "holds NaN or inf values" in message and "Download or copy it again" in message


def test_the_finite_check_sees_every_kind_of_bad_value_and_passes_good_ones():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        good = torch.randn(64, dtype=torch.float32).to(dtype)
        assert not has_nonfinite(good)
        for value in (float("nan"), float("inf"), float("-inf")):
            bad = good.clone()
            bad[7] = value
            assert has_nonfinite(bad), (dtype, value)
    good8 = torch.tensor([-448.0, -1.0, 0.0, 1.0, 448.0]).to(torch.float8_e4m3fn)
    assert not has_nonfinite(good8)
    for byte in (0x7F, 0xFF):
        bad8 = good8.clone()
        bad8.view(torch.uint8)[2] = byte
        assert has_nonfinite(bad8), hex(byte)


@pytest.mark.parametrize("output", [{"snapshot_every": 2, "filename": "{run_name}_final"},
                                    {"snapshot_every": 2, "filename": "{run_name}_{{step}}"},  # a literal "{step}"
                                    {"snapshot_every_epochs": 1, "filename": "mine"}])
def test_snapshots_with_a_filename_without_step_are_refused_before_any_work(output, tmp_path, demo_folder, capsys):
    """Before: each snapshot overwrote the one before, without a word."""
    from test_headless import tiny_run_file

    from trainer_core.runs.cli import main

    path = tiny_run_file(tmp_path, demo_folder, output=output)
    assert main(["train", "--config", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "[output] filename" in err and "has no {step}" in err and "[output] snapshot_every" in err, err
    assert "Put {step} in the name" in err
    assert not (tmp_path / "out" / "t" / "checkpoints").exists()


def test_validation_every_without_validation_images_says_so_in_the_status(tiny, demo_folder, tiny_cache):
    """Before: it trained with no validation and no message."""
    from conftest import cached_demo

    from trainer_core.runs import registry as runs
    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig

    cached = cached_demo(tiny, demo_folder, tiny_cache)
    assert not cached.validation
    opened = runs.open_run(tiny, cached, LoraConfig(rank=2, alpha=2.0), OptimizerConfig(),
                           TrainConfig(run_name="no_validation", validation_every=2), run_dir=None)
    try:
        assert "validation_every=2, but the dataset holds no validation images" in opened.status
        assert "validation_images" in opened.status
    finally:
        runs.release("no_validation")


# ------------------------------------------------------------------------------------------------------------
# settings that cannot do what they say (issue 45): refused where no step could teach the LoRA, said otherwise

def _datasets_cache(components, folders, cache_dir, preservation=None, **dataset):
    """[(folder, loss_weight, is_regularization)] cached as one run's datasets."""
    from conftest import tiny_dataset_config
    from trainer_core.data.cache import build_cache
    from trainer_core.data.images import load_dataset
    from trainer_core.data.mixture import combined

    datasets = [load_dataset(tiny_dataset_config(folder, loss_weight=w, is_regularization=reg, **dataset))
                for folder, w, reg in folders]
    samples, validation, repeats = combined(datasets)
    return build_cache(components, samples, cache_dir, repeats=repeats, validation=validation,
                       preservation=preservation)


@pytest.mark.parametrize("datasets, message", [
    ([(0.0, False)], "every training image's dataset has loss_weight 0, so every step's loss would be 0"),
    ([(0.0, False), (0.0, True)], "every training image's dataset has loss_weight 0"),
    ([(1.0, True)], "every dataset is marked is_regularization: a regularisation set keeps"),
    ([(0.0, False), (1.0, True)], "every dataset is marked is_regularization or has loss_weight 0: "),
], ids=["the only dataset weighs 0", "all weigh 0", "all regularisation", "the subject weighs 0"])
def test_a_run_no_step_could_teach_is_refused_before_it_builds(tiny, demo_folder, tiny_cache, datasets, message):
    """Before: every loss 0 (or no subject) and a LoRA saved as if trained."""
    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.training import Trainer

    cached = _datasets_cache(tiny, [(demo_folder, w, reg) for w, reg in datasets], tiny_cache)
    with pytest.raises(UserInputError, match=re.escape(message)):
        Trainer(tiny, cached, LoraConfig(rank=2), OptimizerConfig(), TrainConfig(run_name="nothing", blocks_to_swap=0))
    assert tiny.transformer is not None and tiny.trainer_ref is None  # nothing built, the model set free


def test_settings_that_change_nothing_are_said_in_the_status(tiny, demo_folder, tiny_cache):
    """Preservation's class captions cached with preservation_weight 0 (encoded for nothing), validation images held
    out with validation_every 0 (neither trained on nor measured), logit-normal settings with uniform sampling,
    ema_decay without ema, LoKr's settings for a LoRA: each a line of Init Trainer's status naming it."""
    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.runs import registry as runs

    cached = _datasets_cache(tiny, [(demo_folder, 1.0, False)], tiny_cache, preservation=("red", "colourful"),
                             validation_images=1)
    opened = runs.open_run(tiny, cached, LoraConfig(rank=2, lokr_factor=4), OptimizerConfig(ema_decay=0.99),
                           TrainConfig(run_name="idle", timestep_sampling="uniform", logit_std=2.0, blocks_to_swap=0),
                           run_dir=None)
    try:
        warnings = [line for line in opened.status.splitlines() if line.startswith("warning: ")]
        assert [w.split(" ")[1] for w in warnings] == ["the", "1", "logit_std=2.0", "ema_decay=0.99", "lokr_factor=4"]
        assert "preservation_weight is 0, so they are not used: set preservation_weight" in warnings[0]
        assert "validation_every is 0, so they are neither trained on nor measured" in warnings[1]
        assert "with timestep_sampling 'uniform'" in warnings[2] and "with ema off" in warnings[3]
        assert "with adapter 'lora'" in warnings[4]
    finally:
        runs.release("idle")
    plain = runs.open_run(tiny, _datasets_cache(tiny, [(demo_folder, 1.0, False)], tiny_cache), LoraConfig(rank=2),
                          OptimizerConfig(), TrainConfig(run_name="plain", blocks_to_swap=0), run_dir=None)
    assert "warning: " not in plain.status  # the defaults say nothing
    runs.release("plain")


def test_a_mask_background_weight_without_masks_is_said_in_the_datasets_summary(demo_folder):
    from conftest import tiny_dataset_config
    from trainer_core.data.images import load_dataset

    summary = load_dataset(tiny_dataset_config(demo_folder, mask_background_weight=0.0)).summary()
    assert ("warning: no image has a loss mask (name_mask.png beside it or masks/name.png), so "
            "mask_background_weight=0 changes nothing") in summary
    assert "warning" not in load_dataset(tiny_dataset_config(demo_folder)).summary()


def test_a_run_file_with_preservation_captions_and_weight_0_skips_encoding_them(tmp_path, demo_folder, capsys):
    """Headless knows both settings before caching: the class captions are not encoded (at real size, a pass of the
    text encoder over every trigger caption), and it says why."""
    from test_headless import tiny_run_file

    from trainer_core.runs.cli import main

    preservation = {"preservation_trigger": "red", "preservation_class": "colourful"}
    path = tiny_run_file(tmp_path, demo_folder, cache=preservation, train={"steps": 1})
    assert main(["train", "--config", str(path), "--output", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert ("warning: preservation_trigger 'red' is set, but preservation_weight is 0, so differential output "
            "preservation is off") in out and "Its class captions are not encoded." in out
    assert "prompts: 9 encoded" in out  # the 8 captions and the empty prompt: no class caption


def edit_folder(tmp_path):
    from trainer_core.families.qwen_image_edit.demo import make_edit_demo_dataset

    return make_edit_demo_dataset(tmp_path / "edit", controls=1)


def edit_discover(folder):
    from trainer_core.data.edit_dataset import discover_edit

    from conftest import tiny_dataset_config

    return discover_edit(tiny_dataset_config(folder))


@pytest.mark.parametrize("which", ["control", "target"])
def test_a_fully_transparent_image_is_refused_by_name(tmp_path, which):
    """Before: a fully transparent control (or target) became one flat background colour without a word."""
    from PIL import Image

    folder = edit_folder(tmp_path)
    name = "00_red_circle_control.png" if which == "control" else "00_red_circle.png"
    Image.new("RGBA", (64, 64), (200, 0, 0, 0)).save(folder / name)
    with pytest.raises(UserInputError, match=rf"image {folder / name} is fully transparent: composited onto the "
                                             r"background it is one flat colour"):
        edit_discover(folder)
    image = Image.new("RGBA", (64, 64), (200, 0, 0, 0))
    image.putpixel((5, 5), (200, 0, 0, 1))  # one barely visible pixel: an image, composited as always
    image.save(folder / name)
    assert len(edit_discover(folder)) == 8


def test_a_target_named_like_a_control_with_its_own_caption_is_a_training_image(tmp_path):
    """Before: 'x_control.png' with its caption was taken as the control of a missing 'x', and a folder of only such
    names was said to have no images."""
    import shutil

    folder = edit_folder(tmp_path)
    shutil.copy(folder / "00_red_circle.png", folder / "sky_control.png")
    (folder / "sky_control.txt").write_text("a sky\n")
    shutil.copy(folder / "00_red_circle.png", folder / "sky_control_control.png")
    samples = edit_discover(folder)
    sky = [s for s in samples if s.image_path.endswith("sky_control.png")]
    assert len(samples) == 9 and len(sky) == 1 and sky[0].controls[0].path.endswith("sky_control_control.png")
    (folder / "sky_control_control.png").unlink()
    with pytest.raises(UserInputError, match=r"image sky_control.png has no control image: add "
                                             r"sky_control_control.png beside it"):
        edit_discover(folder)
    shutil.copy(folder / "00_red_circle.png", folder / "sky.png")  # sky.png beside the captioned sky_control.png
    (folder / "sky.txt").write_text("a sky\n")
    with pytest.raises(UserInputError, match=r"image sky.png has no control image.*sky_control.png has its own "
                                             r"caption, so it is a training image: remove its caption"):
        edit_discover(folder)


def test_a_folder_of_only_control_names_says_so(tmp_path):
    from PIL import Image

    folder = tmp_path / "only_controls"
    folder.mkdir()
    Image.new("RGB", (64, 64), "red").save(folder / "a_control.png")
    with pytest.raises(UserInputError, match=r"has no training images: its 1 images \(first: a_control.png\) are all "
                                             r"named as control images"):
        edit_discover(folder)


@pytest.mark.parametrize("shape", ["one name over 255 bytes", "a path over the system's limit"])
def test_a_cache_folder_path_too_long_is_refused_naming_the_cache_folder(shape, tiny, demo_folder, tmp_path):
    """Before: a raw `OSError: [Errno 36] File name too long` (a run file's or script's cache folder)."""
    import os

    from conftest import cached_demo

    if shape == "one name over 255 bytes":
        folder, expected = tmp_path / ("a" * 300), "has a folder name of 300 bytes"
    else:
        free = os.pathconf(str(tmp_path), "PC_PATH_MAX") - 1 - len(os.fsencode(str(tmp_path))) - 20
        parts = ["b" * 199] * (free // 200) + ["c" * (free % 200 - 1)]  # a path 20 bytes under the limit: the
        folder, expected = Path(tmp_path, *parts), "is too long: the files written inside it"  # entries need more
    with pytest.raises(UserInputError, match=f"cache folder .* {expected}"):
        cached_demo(tiny, demo_folder, folder)


def test_a_write_refused_for_a_too_long_path_is_said_so(tmp_path):
    import errno

    from trainer_core.core.files import write_error

    error = write_error(OSError(errno.ENAMETOOLONG, "File name too long"), "LoRA file", tmp_path / "x",
                        "Nothing was lost.")
    assert str(error).startswith("the path is too long: the LoRA file could not be written to") and "Nothing was lost" \
        in str(error)


# ------------------------------------------------------------------------------------------------------------
# the diffusion-pipe importer on diffusion-pipe's own example (tests/data/diffusion_pipe)

@pytest.mark.parametrize("line, expected", [
    ("micro_batch_size_per_gpu = 1", ("micro_batch_size_per_gpu = 'two'", "micro_batch_size_per_gpu = 'two' must be a "
                                      "whole number")),
    ("micro_batch_size_per_gpu = 1", ("micro_batch_size_per_gpu = 1.5", "micro_batch_size_per_gpu = 1.5 must be a "
                                      "whole number")),
    ("micro_batch_size_per_gpu = 1", ("micro_batch_size_per_gpu = [[512, 1.5]]", "or a list of [resolution, batch size]")),
    ("gradient_accumulation_steps = 4", ("gradient_accumulation_steps = '4'", "gradient_accumulation_steps = '4' must be "
                                         "a whole number")),
    ("rank = 32", ("rank = 32.5", "adapter.rank = 32.5 must be a whole number")),
    ("weight_decay = 0.01", ("weight_decay = '0.01'", "optimizer.weight_decay = '0.01' must be a number (no quotes)")),
], ids=["text", "fraction", "list of fractions", "grad accum as text", "rank fraction", "weight decay as text"])
def test_a_diffusion_pipe_field_of_the_wrong_kind_is_refused_by_name(line, expected, tmp_path, demo_folder):
    """Before: a raw conversion error naming no field, or 1.5 silently cut to 1."""
    from test_headless import diffusion_pipe_copy

    from trainer_core.runs.diffusion_pipe import translate

    replacement, message = expected
    model = {"diffusers_path": str(tmp_path / "Qwen-Image")}
    config = diffusion_pipe_copy(tmp_path, model, demo_folder, {re.escape(line): replacement})
    with pytest.raises(UserInputError) as refused:
        translate(config, cwd=tmp_path)
    assert str(refused.value).startswith(f"diffusion-pipe config {config}: ") and message in str(refused.value)


def test_print_only_prints_the_translation_when_the_model_folder_is_not_here_and_warns_once(tmp_path, demo_folder,
                                                                                           capsys):
    """Before: refused (a user preparing a run for another machine saw nothing), and the error said 'the
    translation of X: ' twice."""
    from test_headless import diffusion_pipe_copy

    from trainer_core.runs.cli import main

    config = diffusion_pipe_copy(tmp_path, {"diffusers_path": "/elsewhere/Qwen-Image"}, demo_folder)
    assert main(["train", "--from-diffusion-pipe", str(config), "--print-only"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("# Run file translated from diffusion-pipe's") and "diffusers_folder = " in out
    assert err.startswith("warning: ") and "diffusers_folder = '/elsewhere/Qwen-Image' is not a folder" in err
    assert err.count("the translation of") == 1
    assert main(["train", "--from-diffusion-pipe", str(config)]) == 2  # to train, the folder must be here
    err = capsys.readouterr().err
    assert err.count("the translation of") == 1 and "is not a folder" in err, err


def test_print_only_says_a_refused_value_trains_nowhere(tmp_path, demo_folder, capsys):
    """Before: the warning for a refused value (epochs = -1) ended 'it trains where that path exists', which only a
    missing path (prepared for another machine) makes true."""
    from test_headless import diffusion_pipe_copy

    from trainer_core.runs.cli import main

    config = diffusion_pipe_copy(tmp_path, {"diffusers_path": "/elsewhere/Qwen-Image"}, demo_folder,
                                 {"epochs = 1000": "epochs = -1"})
    assert main(["train", "--from-diffusion-pipe", str(config), "--print-only"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "epochs = -1" in err and "where that path exists" not in err
    assert "it trains nowhere as it is: correct that setting in it first" in err


# ------------------------------------------------------------------------------------------------------------
# names and paths

@pytest.mark.parametrize("filename, message", [
    ("..", "names no file"), ("qwen/..", "names no file"), ("name.", "ends with a dot or a space"),
    ("name .safetensors", "ends with a dot or a space"), ("name..safetensors", "ends with a dot or a space"),
    ("name ", "ends with a dot or a space"), ("qwen/name ", "ends with a dot or a space"), ("  ", "names no file")])
def test_lora_names_that_windows_drops_or_that_name_no_file_are_refused(filename, message, tmp_path):
    """Before: '..' wrote the hidden file '...safetensors', 'name.' wrote 'name..safetensors'; 'name ' wrote
    name.safetensors, a name other than the one typed (issue 45: it is refused by the same rule as 'name.')."""
    from trainer_core.adapters.lora_files import lora_output_path

    with pytest.raises(UserInputError, match=message):
        lora_output_path(tmp_path, filename, "run", 1)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["../outside.safetensors", "sub/../../outside.safetensors", "/abs/outside.safetensors",
                                  "..\\outside.safetensors"])
def test_a_model_file_name_outside_its_folder_is_refused_standalone(pack, name, tmp_path, monkeypatch):
    """Before: the standalone lookup (no ComfyUI) resolved a name with '..' or an absolute path outside the models
    folder (ComfyUI's own lookup keeps names inside its folders)."""
    from conftest import pack_module

    host = pack_module(pack, "nodes.host")
    errors = pack_module(pack, "trainer_core.core.errors")
    (tmp_path / "models" / "loras").mkdir(parents=True)
    (tmp_path / "outside.safetensors").write_bytes(b"x")
    monkeypatch.setenv("QWEN_LORA_MODELS", str(tmp_path / "models"))
    with pytest.raises(errors.UserInputError, match="is not a name inside the loras folder"):
        host.model_file_path("loras", name)
    (tmp_path / "models" / "loras" / "mine.safetensors").write_bytes(b"x")
    assert host.model_file_path("loras", "mine.safetensors") == tmp_path / "models" / "loras" / "mine.safetensors"


# ------------------------------------------------------------------------------------------------------------
# small canvas confusions

def test_compare_steps_says_when_the_first_preview_comes_when_preview_every_is_set(pack, tmp_path, demo_folder,
                                                                                   monkeypatch):
    """Before: 'no previews yet. Set Train Steps' preview_every above 0' although it was set (the queue ran fewer
    steps than preview_every). A run that starts with previews on has the untrained model's at step 0; this one
    turned them on later (a first queue without, then a second with preview_every 5, ending at step 3)."""
    import host_standin
    import numpy as np
    from graph_runner import GraphRunner
    from test_live_previews import with_compare
    from test_nodes import tiny_prompt

    from conftest import pack_module

    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    host_standin.install(monkeypatch)
    live = pack_module(pack, "trainer_core.training.live")
    assert live.no_previews_text(5, 2) == ("no previews yet: Train Steps' preview_every\nis 5 and the run is at step "
                                           "2:\nthe first comes at step 5. Queue\nTrain Steps again, or lower "
                                           "preview_every.")
    assert "Set Train Steps' preview_every above 0" in live.no_previews_text(0, 2)
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    runner.run(tiny_prompt(tmp_path, demo_folder, steps=2, **{"7": {"preview_every": 0}}))
    outputs = runner.run(with_compare(tiny_prompt(tmp_path, demo_folder, steps=1, **{"7": {"preview_every": 5}})))
    trainer, (grid,) = outputs["7"][0], outputs["16"]
    name = trainer.train_cfg.run_name
    assert trainer.step == 3 and trainer.step_previews == []
    expected = np.asarray(live.step_grid([], 0, 64, title=name, preview_every=5, step=3))
    assert np.array_equal((grid[0].numpy() * 255).round().astype(np.uint8), expected)
    assert not np.array_equal(expected, np.asarray(live.step_grid([], 0, 64, title=name)))


def test_the_4bit_kernel_message_of_bitsandbytes_is_dropped_and_its_other_messages_still_show():
    """Before: on a CPU with AVX512-BF16 bitsandbytes' import logged "Failed to load CPU gemm_4bit_forward from
    kernels-community: No module named 'kernels'", which read like an error at the first step (its 4-bit matmul,
    never used by 8-bit AdamW; peft imports bitsandbytes before the optimizer does). The filter the package installs
    on that logger drops that one message only. That it is installed before bitsandbytes' first import (the import
    that logs) is checked in a fresh process that trains with 8-bit AdamW: test_resume.py's new process, whose
    stderr must not hold the message (on a CPU without AVX512-BF16 bitsandbytes never logs it)."""
    import logging

    import trainer_core  # noqa: F401  (installs the filter)
    from trainer_core.core.quiet import BITSANDBYTES_CPU_OPS

    logger = logging.getLogger(BITSANDBYTES_CPU_OPS)
    # The logger's own filters, whatever level or handlers other tests left it with.
    def kept(message: str) -> bool:
        return bool(logger.filter(logger.makeRecord(logger.name, logging.WARNING, __file__, 0, message, (), None)))

    assert not kept("Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'")
    assert kept("another warning still shows")
