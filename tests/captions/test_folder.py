"""Writing captions into a dataset folder with a tiny Qwen2.5-VL (random weights: gibberish captions, which is all
these tests need): one caption per uncaptioned image, existing ones byte-identical, backups when overwriting, the
trigger word, the same files from two runs, a stop between images, what is not a training image left alone."""

from __future__ import annotations

import pytest
from caption_files import QWEN25_VL, picture, tiny_encoders  # noqa: F401 (a fixture)

from trainer_core.core.config import CaptionConfig

TOKENS = 6  # a short caption: the tests are about the files


def dataset(folder):
    """Three training images (one captioned by hand), a loss mask, an edit control image and a hidden file."""
    folder.mkdir()
    for name, colour in (("a.png", (200, 20, 20)), ("b.jpg", (20, 200, 20)), ("c.webp", (20, 20, 200)),
                         ("a_mask.png", (0, 0, 0)), ("b_control.png", (90, 90, 90)), (".hidden.png", (1, 1, 1))):
        picture(64, 48, colour).save(folder / name)
    (folder / "b.txt").write_bytes("my own words, ünïcode\n".encode())
    return folder


@pytest.fixture(scope="module")
def vlm(tiny_encoders):
    from trainer_core.captions.model import vision_language_model

    with vision_language_model(tiny_encoders[QWEN25_VL]) as model:
        yield model


def run(vlm, folder, **settings):
    from trainer_core.captions.folder import caption_folder

    return caption_folder(vlm, CaptionConfig(folder=str(folder), max_new_tokens=TOKENS, **settings),
                          min_new_tokens=TOKENS)


def files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in (".txt", ".bak", ".bak2")}


def test_one_caption_per_uncaptioned_image_and_the_rest_untouched(vlm, tmp_path):
    folder = dataset(tmp_path / "set")
    mine = (folder / "b.txt").read_bytes()
    report = run(vlm, folder, trigger="ohwx")
    assert sorted(files(folder)) == ["a.txt", "b.txt", "c.txt"]  # no caption for the mask or the control image
    assert (folder / "b.txt").read_bytes() == mine
    assert [(r.image.name, r.status) for r in report.results] == [("a.png", "written"), ("b.jpg", "kept"),
                                                                    ("c.webp", "written")]
    for name in ("a.txt", "c.txt"):
        text = (folder / name).read_text(encoding="utf-8")
        assert text.startswith("ohwx, ") and len(text) > len("ohwx, ")
    assert "2 written" in report.summary() and "1 kept" in report.summary()

    again = run(vlm, folder, trigger="ohwx")  # nothing left to caption: all kept
    assert [r.status for r in again.results] == ["kept"] * 3


def test_two_runs_write_identical_files(vlm, tmp_path):
    first, second = dataset(tmp_path / "one"), dataset(tmp_path / "two")
    run(vlm, first)
    run(vlm, second)
    assert files(first) == files(second)


def test_overwriting_keeps_every_earlier_caption(vlm, tmp_path):
    folder = dataset(tmp_path / "set")
    mine = (folder / "b.txt").read_bytes()
    report = run(vlm, folder, overwrite=True, style="tags")
    assert (folder / "b.txt.bak").read_bytes() == mine
    assert report.results[1].status == "replaced" and report.results[1].backup == folder / "b.txt.bak"
    first_generated = (folder / "a.txt").read_bytes()
    (folder / "b.txt").write_bytes(b"edited again by hand")
    run(vlm, folder, overwrite=True, style="tags")
    assert (folder / "b.txt.bak").read_bytes() == mine  # never clobbered
    assert (folder / "b.txt.bak2").read_bytes() == b"edited again by hand"
    assert (folder / "a.txt.bak").read_bytes() == first_generated


def test_a_stop_between_images_keeps_what_was_written(vlm, tmp_path):
    from trainer_core.captions.folder import caption_folder

    folder = dataset(tmp_path / "set")
    done = []
    report = caption_folder(vlm, CaptionConfig(folder=str(folder), max_new_tokens=TOKENS), stop=lambda: len(done) >= 1,
                            progress=lambda i, total, result: done.append((i, total, result.image.name)),
                            min_new_tokens=TOKENS)
    assert done == [(1, 3, "a.png")] and report.stopped
    assert sorted(files(folder)) == ["a.txt", "b.txt"]


def test_no_model_is_loaded_when_every_image_has_its_caption(tmp_path):
    from trainer_core.captions.folder import caption_dataset

    folder = tmp_path / "set"
    folder.mkdir()
    picture(32, 32, (5, 5, 5)).save(folder / "x.png")
    (folder / "x.txt").write_text("done")
    report = caption_dataset(CaptionConfig(folder=str(folder)), text_encoder=tmp_path / "absent.safetensors")
    assert [r.status for r in report.results] == ["kept"]


@pytest.mark.parametrize("settings, answer, caption", [
    (dict(), "  A red\n circle. ", "A red circle."),
    (dict(trigger="ohwx"), "a red circle", "ohwx, a red circle"),
    (dict(trigger="ohwx"), "{trigger} on a red circle", "ohwx on a red circle"),
    (dict(trigger="ohwx"), "ohwx on a red circle", "ohwx on a red circle"),
    (dict(style="tags", trigger="ohwx"), "red,\ncircle, , blue.", "ohwx, red, circle, blue"),
    (dict(), '"quoted answer"', "quoted answer"),
    (dict(trigger="ohwx"), "   ", ""),
])
def test_answers_become_captions(settings, answer, caption):
    from trainer_core.captions.prompts import finish_caption

    assert finish_caption(answer, CaptionConfig(**settings)) == caption


def test_the_instruction_folds_in_the_trigger_and_what_to_leave_out():
    from trainer_core.captions.prompts import DEFAULT_INSTRUCTIONS, instruction_text

    assert instruction_text(CaptionConfig(style="detailed")) == DEFAULT_INSTRUCTIONS["detailed"]
    text = instruction_text(CaptionConfig(instruction="Caption {trigger}'s photo.", trigger="ohwx", avoid="her face."))
    assert text == "Caption ohwx's photo. Do not mention her face."


def test_bad_settings_are_refused_by_name():
    from trainer_core.core.errors import UserInputError

    with pytest.raises(UserInputError, match="style"):
        CaptionConfig(style="poem")
    with pytest.raises(UserInputError, match="trigger"):
        CaptionConfig(trigger="two\nlines")
    with pytest.raises(UserInputError, match="max_new_tokens"):
        CaptionConfig(max_new_tokens=-3)


def edit_folder(folder):
    """An Edit Dataset's folder: a with one control beside it, c with two (name_control.png, name_control_2.png)."""
    folder.mkdir()
    picture(64, 48, (200, 20, 20)).save(folder / "a.png")
    picture(64, 48, (90, 90, 90)).save(folder / "a_control.png")
    picture(48, 64, (20, 20, 200)).save(folder / "c.png")
    picture(48, 64, (60, 60, 60)).save(folder / "c_control.png")
    picture(32, 32, (10, 200, 10)).save(folder / "c_control_2.png")
    return folder


def test_the_edit_style_writes_each_targets_instruction_from_its_controls_then_itself(vlm, tmp_path):
    """An edit dataset's caption is its instruction: the model is shown the target's controls in order, then the
    target, and asked what changed; what is written is exactly that answer (the same call made by hand), for the
    targets only."""
    from trainer_core.captions.generate import Decoding, answer
    from trainer_core.captions.prompts import finish_caption, instruction_text
    from trainer_core.data.images import open_image

    folder = edit_folder(tmp_path / "edits")
    report = run(vlm, folder, style="edit")
    assert [r.image.name for r in report.results] == ["a.png", "c.png"]
    settings = CaptionConfig(folder=str(folder), style="edit", max_new_tokens=TOKENS)
    for target, controls in (("a", ["a_control"]), ("c", ["c_control", "c_control_2"])):
        shown = [open_image(folder / f"{name}.png") for name in (*controls, target)]
        _, text = answer(vlm, shown, instruction_text(settings), Decoding(max_new_tokens=TOKENS, min_new_tokens=TOKENS))
        assert (folder / f"{target}.txt").read_text(encoding="utf-8") == finish_caption(text, settings)
    assert sorted(files(folder)) == ["a.txt", "c.txt"]


def test_the_edit_style_refuses_a_target_without_a_control_before_loading_the_model(tmp_path):
    from trainer_core.captions.folder import caption_dataset
    from trainer_core.core.errors import UserInputError

    folder = edit_folder(tmp_path / "edits")
    picture(40, 40, (1, 2, 3)).save(folder / "lonely.png")
    with pytest.raises(UserInputError, match=r"image lonely.png has no control image: add lonely_control.png .* The "
                                             r"'edit' style captions an Edit Dataset"):
        caption_dataset(CaptionConfig(folder=str(folder), style="edit"), text_encoder=tmp_path / "absent.safetensors")
    assert not list(folder.glob("*.txt"))


def test_a_batch_captions_every_image_once_in_file_order_and_keeps_the_rest(vlm, tmp_path):
    """batch_size 2 over three images of which two need captions: one generate call writes both; the report lists the
    images in file-name order, the hand-written caption untouched; progress counts every image once."""
    from trainer_core.captions.folder import caption_folder

    folder = dataset(tmp_path / "set")
    mine = (folder / "b.txt").read_bytes()
    heard = []
    report = caption_folder(vlm, CaptionConfig(folder=str(folder), max_new_tokens=TOKENS, batch_size=2),
                            progress=lambda i, total, result: heard.append((i, total, result.image.name)),
                            min_new_tokens=TOKENS)
    assert [(r.image.name, r.status) for r in report.results] == [("a.png", "written"), ("b.jpg", "kept"),
                                                                    ("c.webp", "written")]
    assert sorted(name for _i, _t, name in heard) == ["a.png", "b.jpg", "c.webp"] and [i for i, *_ in heard] == [1, 2, 3]
    assert (folder / "b.txt").read_bytes() == mine and (folder / "a.txt").read_bytes() and (folder / "c.txt").read_bytes()


def test_the_batch_is_one_on_a_cpu_and_the_plans_most_that_fit_on_a_gpu():
    """batch_size 0: one image at a time on a CPU; on a GPU the plan's captioning phase decides: the most images whose
    phase fits the budget (each image's prefill, KV cache and logits times the batch; the weights once)."""
    import dataclasses

    from trainer_core.families import get_family
    from trainer_core.planner.captioning import caption_batch_that_fits, caption_phase
    from trainer_core.planner.plan import PlanInputs

    parts = get_family("qwen-image").planned_caption_parts()
    plan = PlanInputs(caption=True, device="cuda", caption_storage="float8", text_encoder_file_fp8=True)
    one, three, four = (caption_phase(dataclasses.replace(plan, caption_batch=b), parts) for b in (1, 3, 4))
    per_image = {t.name: t.bytes for t in one.gpu if t.name in ("prefill forward", "KV cache", "logits")}
    for name, bytes_ in per_image.items():
        assert next(t.bytes for t in four.gpu if t.name == name) == 4 * bytes_, name
    assert next(t.bytes for t in four.gpu if t.name == "VL model weights") == next(
        t.bytes for t in one.gpu if t.name == "VL model weights")
    assert caption_batch_that_fits(plan, parts, (three.gpu_bytes + four.gpu_bytes) // 2) == 3
    assert caption_batch_that_fits(plan, parts, one.gpu_bytes - 1) == 1


def test_captioning_that_would_not_fit_the_gpu_is_refused_naming_the_image_side_that_would():
    """On a GPU the plan's captioning phase is checked before anything loads (planner/device.py): over the free memory,
    a UserInputError says what it needs, what is free and the largest image_side whose phase fits; the CPU is named as
    the way out when no side fits. (Qwen-Image 2.1's Qwen3-VL-8B with its Linears kept in one byte, in 11 GiB free: a
    12 GB card less its CUDA context and what else runs.)"""
    import dataclasses

    from trainer_core.core.errors import UserInputError
    from trainer_core.families import get_family
    from trainer_core.planner.captioning import caption_phase
    from trainer_core.planner.device import CAPTION_SIDES, check_caption_fits
    from trainer_core.planner.plan import GIB, PlanInputs

    parts = get_family("qwen-image-2.1").planned_caption_parts()
    plan = PlanInputs(caption=True, device="cuda", caption_storage="float8", text_encoder_file_fp8=True,
                      cuda_context_bytes=0)
    budget = int(11.5 * GIB)  # between the 1024 px need and the smallest sides' (the CUDA baseline is measured)
    need = caption_phase(plan, parts).gpu_bytes
    assert need > budget
    fitting = [s for s in CAPTION_SIDES if caption_phase(dataclasses.replace(plan, caption_image=(s, s)),
                                                         parts).gpu_bytes <= budget]
    with pytest.raises(UserInputError, match=rf"captioning needs {need / GIB:.2f} GiB on the GPU .* but 11.50 GiB are "
                                             rf"free\. Nothing was loaded\. To fit: set image_side to {fitting[0]}; "
                                             r"or caption on the CPU"):
        check_caption_fits(plan, parts, budget, one_byte_file=True)
    check_caption_fits(dataclasses.replace(plan, caption_image=(fitting[0], fitting[0])), parts, budget, True)
    with pytest.raises(UserInputError, match=r"To fit: use the file's one-byte version .*; or caption on the CPU"):
        check_caption_fits(dataclasses.replace(plan, caption_storage="bfloat16"), parts, 4 * GIB, one_byte_file=False)


def test_images_are_shown_at_most_image_side_squared_pixels():
    from trainer_core.captions.generate import shown_image

    shown = shown_image(picture(2048, 1024, (1, 2, 3)), 512 * 512)
    assert shown.size == (724, 362) and shown.width * shown.height <= 512 * 512
    assert shown_image(picture(300, 200, (1, 2, 3)), 512 * 512).size == (300, 200)  # never enlarged
