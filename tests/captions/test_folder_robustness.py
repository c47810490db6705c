"""What the captioner does with a folder it cannot use as it is, in real processes: a read-only folder refused by name
before the model loads (a real read-only bind mount in a user namespace: the tests run as root, whom permissions do
not stop); a run killed mid-write leaves only `.NAME.txt.PID.tmp`, which the next run clears (and nothing of anyone
else's); two images of one name refused; control characters in the trigger refused, and left out of the model's
answers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from caption_files import QWEN3_VL, picture, tiny_encoders  # noqa: F401 (a fixture)

from trainer_core.core.config import CaptionConfig
from trainer_core.core.errors import UserInputError

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def folder_of(tmp_path, *names):
    folder = tmp_path / "set"
    folder.mkdir()
    for i, name in enumerate(names):
        picture(40, 32, (40 * i, 200, 90)).save(folder / name)
    return folder


def caption_argv(folder, text_encoder):
    return ["caption", "--folder", str(folder), "--text-encoder", str(text_encoder), "--max-tokens", "3",
            "--device", "cpu"]


def can_mount_read_only() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not can_mount_read_only(), reason="needs `unshare -rm` (user and mount namespaces)")
def test_a_read_only_folder_is_refused_by_name_before_the_model_loads(tmp_path):
    """The folder is bind-mounted read-only in a namespace of its own; the text encoder file is garbage, so an error
    about the folder proves the folder was checked before the model was read."""
    folder = folder_of(tmp_path, "a.png", "b.png")
    broken = tmp_path / "qwen3vl_broken.safetensors"
    broken.write_bytes(b"not a safetensors file at all")
    command = " ".join([
        f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} &&",
        f"exec {sys.executable} -m trainer_core", *caption_argv(folder, broken)])
    done = subprocess.run(["unshare", "-rm", "sh", "-c", command], capture_output=True, text=True, env=ENV, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    assert "the disk is read-only: the captions could not be written to" in done.stderr and str(folder) in done.stderr
    assert "No caption was written and the model was not loaded" in done.stderr
    assert "Traceback" not in done.stderr and "qwen3vl_broken" not in done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["a.png", "b.png"]


KILLED_WRITE = textwrap.dedent("""
    import os, signal, sys
    real_replace = os.replace
    def replace(source, target, *args, **kwargs):  # the caption is written in full; the rename never comes
        if str(target).endswith(".txt"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(source, target, *args, **kwargs)
    os.replace = replace
    from trainer_core.runs.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_run_killed_mid_write_leaves_a_leftover_the_next_run_clears_and_nothing_else(tiny_encoders, tmp_path):
    folder = folder_of(tmp_path, "a.png", "b.png")
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # another caption run, say
    try:
        _killed_then_cleared(folder, tiny_encoders[QWEN3_VL], alive.pid)
    finally:
        alive.kill()
        alive.wait()


def _killed_then_cleared(folder, text_encoder, live_pid):
    others = {".notes.txt.1.tmp.keep": b"a user's", "notes.tmp": b"a user's", ".model.safetensors.999999.tmp": b"x",
              f".b.txt.{live_pid}.tmp": b"a live process's"}
    for name, data in others.items():
        (folder / name).write_bytes(data)
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITE, *caption_argv(folder, text_encoder)],
                            capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    leftovers = [p for p in folder.iterdir() if p.name.startswith(".a.txt.")]
    assert len(leftovers) == 1 and leftovers[0].name == f".a.txt.{_pid_of(leftovers[0])}.tmp"
    assert leftovers[0].read_bytes()  # the whole caption, under the temporary name
    assert not (folder / "a.txt").exists()  # never half a caption under the real name

    from trainer_core.runs.cli import main

    assert main(caption_argv(folder, text_encoder)) == 0
    assert not leftovers[0].exists()
    for name, data in others.items():  # a user's files, another writer's, a live process's: untouched
        assert (folder / name).read_bytes() == data


def _pid_of(path: Path) -> int:
    return int(path.name.rsplit(".", 2)[1])


@pytest.mark.parametrize("names", [("a.jpg", "a.png"), ("B.webp", "b.png")])  # (in file-name order)
def test_two_images_of_one_name_are_refused_before_the_model_loads(tmp_path, names):
    from trainer_core.captions.folder import caption_dataset

    folder = folder_of(tmp_path, "z.png", *names)
    shared = f"{names[0]} and {names[1]} -> {Path(names[0]).stem}.txt"
    with pytest.raises(UserInputError, match=rf"{folder}.* share one caption file \({shared}\).*Rename all but one of each \(e.g. {names[1]} -> "
                                         rf"{Path(names[1]).stem}_2{Path(names[1]).suffix}\)"):
        caption_dataset(CaptionConfig(folder=str(folder)), text_encoder=tmp_path / "absent.safetensors")
    assert not list(folder.glob("*.txt"))


@pytest.mark.parametrize("name, value", [("trigger", "oh\x1bwx"), ("trigger", "ohwx\x00"), ("trigger", "oh\u2028wx"),
                                         ("avoid", "her\x07face"), ("instruction", "Caption it.\x1b[0m")])
def test_control_characters_in_the_words_written_into_captions_are_refused_by_name(name, value):
    with pytest.raises(UserInputError, match=rf"^{name}=.* has the control character .*\(U\+[0-9A-F]{{4}}\) at position "
                                             rf"\d+: .*Type the {name} again"):
        CaptionConfig(**{name: value})
    CaptionConfig(instruction="Caption it.\nOne line.\tPlease.")  # an instruction's line breaks and tabs are fine


def test_control_characters_the_model_writes_are_left_out_of_the_caption():
    from trainer_core.captions.prompts import finish_caption

    answer = "a \x1b[31mred\x00 circle\u2028on\u2029a mat\x85"
    assert finish_caption(answer, CaptionConfig(trigger="ohwx")) == "ohwx, a [31mred circle on a mat"


def test_a_folder_where_a_caption_goes_is_refused_before_the_model_loads_when_overwriting(tmp_path):
    from trainer_core.captions.folder import caption_dataset

    folder = folder_of(tmp_path, "a.png", "b.png")
    (folder / "b.txt").mkdir()
    with pytest.raises(UserInputError, match=r"b\.txt is a folder where b\.png's caption file goes: rename or move it"):
        caption_dataset(CaptionConfig(folder=str(folder), overwrite=True), text_encoder=tmp_path / "absent.safetensors")
    assert not (folder / "a.txt").exists()
