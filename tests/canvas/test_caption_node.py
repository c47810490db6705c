"""The Caption Dataset node (nodes/caption_nodes.py) in the stand-in host: the text encoder file picked from
models/text_encoders as ComfyUI lists it, the captions it writes equal to what the engine's `caption_dataset` writes
for the same folder, hand-written captions kept, the review picture (a tile per image with its caption under it) and
report, the folder's state in IS_CHANGED (a caption edited on disk runs it again)."""

from __future__ import annotations

import shutil

import numpy as np
import torch
from caption_files import QWEN25_VL, picture, tiny_encoders  # noqa: F401 (a fixture)


def folder_with_images(folder):
    folder.mkdir()
    for name, colour in (("a.png", (240, 10, 10)), ("b.png", (10, 240, 10)), ("c.png", (10, 10, 240))):
        picture(48, 40, colour).save(folder / name)
    (folder / "b.txt").write_text("written by hand")
    return folder


def test_the_node_writes_what_the_engine_writes_keeps_hand_written_captions_and_shows_them(
        pack, tiny_encoders, tmp_path, monkeypatch):
    from trainer_core.captions.folder import caption_dataset
    from trainer_core.core.config import CaptionConfig

    models = tmp_path / "models" / "text_encoders"
    models.mkdir(parents=True)
    source = tiny_encoders[QWEN25_VL]
    shutil.copy(source, models / source.name)
    shutil.copy(source.with_suffix(".json"), models / source.with_suffix(".json").name)  # a tiny model's config
    shutil.copytree(source.parent / "tokenizer", models / "tokenizer")  # where the Load node looks first
    monkeypatch.setenv("QWEN_LORA_MODELS", str(tmp_path / "models"))
    node_cls = pack.NODE_CLASS_MAPPINGS["QwenLoRACaptionDataset"]
    assert source.name in node_cls.INPUT_TYPES()["required"]["text_encoder"][0]  # listed as ComfyUI lists the folder

    ours, theirs = folder_with_images(tmp_path / "node"), folder_with_images(tmp_path / "engine")
    settings = dict(style="tags", instruction="", trigger="ohwx", avoid="", max_new_tokens=6, overwrite=False, seed=-1)
    before = node_cls.IS_CHANGED(folder=str(ours))
    image, report = node_cls().caption(folder=str(ours), text_encoder=source.name, **settings)
    caption_dataset(CaptionConfig(folder=str(theirs), text_encoder=source.name, **settings), source)

    def captions(folder):
        return {p.name: p.read_bytes() for p in sorted(folder.glob("*.txt*"))}

    assert captions(ours) == captions(theirs)  # the same model, image and prompt: the same captions
    assert (ours / "b.txt").read_text() == "written by hand"  # kept, no backup made
    assert not list(ours.glob("*.bak*"))
    lines = report.splitlines()
    assert [line.split(": ", 1)[0] for line in lines[:-1]] == ["a.png", "b.png", "c.png"]
    assert lines[1] == "b.png: (kept) written by hand" and lines[-1].startswith("3 images in ")
    for name in ("a", "c"):  # a caption written is the one reported
        written = ours / f"{name}.txt"
        shown = written.read_text(encoding="utf-8") if written.exists() else "(no caption: the model wrote nothing usable)"
        assert f"{name}.png: {shown}" in lines

    # the review picture: three tiles of 256 px (two per row), each with room for its caption's lines under it
    assert isinstance(image, torch.Tensor) and tuple(image.shape) == (1, 2 * (256 + 8 * 12 + 8), 2 * 256, 3)
    sheet = (image[0].numpy() * 255).round().astype(np.uint8)
    assert (sheet[256:256 + 24, :256] == 0).all(-1).any()  # the first caption's black text under its tile
    written = node_cls.IS_CHANGED(folder=str(ours))
    assert written != before  # the captions written changed the folder's state
    (ours / "b.txt").write_text("edited again by hand")
    assert node_cls.IS_CHANGED(folder=str(ours)) != written  # a caption edited on disk queues the node again
    _, report = node_cls().caption(folder=str(ours), text_encoder=source.name, **settings)
    assert "b.png: (kept) edited again by hand" in report.splitlines()
