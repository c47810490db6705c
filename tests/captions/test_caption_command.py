"""`python -m trainer_core caption` end to end (in this process: argparse, the model's load and release, the files,
the printed lines), on a tiny folder with the tiny Qwen3-VL file (its tokenizer beside it)."""

from __future__ import annotations

from caption_files import QWEN3_VL, picture, tiny_encoders  # noqa: F401 (a fixture)


def test_the_caption_command_writes_prints_and_keeps(tiny_encoders, tmp_path, capsys):
    from trainer_core.runs.cli import main

    folder = tmp_path / "set"
    folder.mkdir()
    for name, colour in (("one.png", (250, 0, 0)), ("two.png", (0, 250, 0)), ("three.png", (0, 0, 250))):
        picture(48, 40, colour).save(folder / name)
    (folder / "two.txt").write_text("by hand")
    argv = ["caption", "--folder", str(folder), "--text-encoder", str(tiny_encoders[QWEN3_VL]), "--style", "tags",
            "--trigger", "ohwx", "--max-tokens", "5", "--device", "cpu"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("3 images in ") and "1 kept" in lines[-1]
    printed = dict(line.split(": ", 1) for line in lines[:-1])
    assert list(printed) == ["one.png", "three.png", "two.png"] and printed["two.png"] == "(kept) by hand"
    assert (folder / "two.txt").read_text() == "by hand"
    for name in ("one", "three"):  # a caption written is the one printed (random weights may end a turn at once)
        caption = folder / f"{name}.txt"
        assert printed[f"{name}.png"] == (caption.read_text(encoding="utf-8") if caption.exists() else
                                          "(no caption: the model wrote nothing usable)")
        assert not caption.exists() or caption.read_text(encoding="utf-8").startswith("ohwx, ")

    written = {p.name: p.read_bytes() for p in folder.glob("*.txt") if p.name != "two.txt"}
    assert main(argv + ["--overwrite"]) == 0  # greedy: the same captions again, the old ones backed up
    assert {p.name: p.read_bytes() for p in folder.glob("*.txt") if p.name != "two.txt"} == written
    assert {p.name: p.read_bytes() for p in folder.glob("*.txt.bak")} == {f"{n}.bak": b for n, b in written.items()} | (
        {"two.txt.bak": b"by hand"} if (folder / "two.txt").read_text() != "by hand" else {})


def test_a_bad_flag_is_one_line_naming_it(tmp_path, capsys):
    from trainer_core.runs.cli import main

    assert main(["caption", "--folder", str(tmp_path), "--text-encoder", str(tmp_path / "none.safetensors")]) == 2
    assert "--text-encoder" in capsys.readouterr().err
