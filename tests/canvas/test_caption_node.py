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
    settings = dict(style="tags", instruction="", trigger="ohwx", avoid="", max_new_tokens=6, overwrite=False,
                    sampling_seed=-1)
    before = node_cls.IS_CHANGED(folder=str(ours))
    image, report, captioned = node_cls().caption(folder=str(ours), text_encoder=source.name, **settings)
    assert captioned == str(ours)  # for the Dataset node's folder, wired
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
    _, report, _ = node_cls().caption(folder=str(ours), text_encoder=source.name, **settings)
    assert "b.png: (kept) edited again by hand" in report.splitlines()


def three_captions_removed(demo_folder, folder):
    """(a copy of the demo folder with its first three captions removed, those caption paths, {name: bytes} of the
    captions kept)."""
    shutil.copytree(demo_folder, folder)
    removed = sorted(folder.glob("*.txt"))[:3]
    kept = {p.name: p.read_bytes() for p in sorted(folder.glob("*.txt"))[3:]}
    for p in removed:
        p.unlink()
    return folder, removed, kept


def captioned_prompt(tmp_path, folder, text_encoder: str, steps: int = 2) -> dict:
    """The shipped caption-first workflow's API twin on the tiny files: its Caption Dataset node on `folder` with the
    tiny text encoder `text_encoder` (its vision tower and head), the Dataset's folder wired from it as shipped."""
    from conftest import api_workflow
    from test_nodes import tiny_prompt

    prompt = tiny_prompt(tmp_path, folder, steps=steps, from_files=True, workflow=api_workflow("captioned"))
    prompt["2"]["inputs"]["folder"] = ["21", 2]  # (tiny_prompt points the Dataset at a folder: wired back as shipped)
    prompt["21"]["inputs"].update(folder=str(folder), text_encoder=text_encoder, max_new_tokens=8)
    return prompt


def test_the_shipped_caption_workflow_captions_the_folder_then_trains_on_it(pack, tiny_files, demo_folder, tmp_path,
                                                                           monkeypatch):
    """Caption Dataset writes the captions the folder lacks before the Dataset node reads it (its folder wired from
    the Caption node), the captions kept stay byte for byte, and the run trains on the captions on disk."""
    from graph_runner import GraphRunner

    folder, removed, kept = three_captions_removed(demo_folder, tmp_path / "images")
    monkeypatch.setenv("QWEN_LORA_MODELS", str(tiny_files["vae"].parents[1]))
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    prompt = captioned_prompt(tmp_path, folder, tiny_files["text_encoder_fp8_scaled"].name)
    outputs = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)
    assert all(p.exists() for p in removed)  # written before the Dataset node read the folder
    assert {name: (folder / name).read_bytes() for name in kept} == kept
    assert outputs["7"][0].step == 2
    captions = {s.caption for s in outputs["2"][0].samples}
    assert {p.read_text(encoding="utf-8").strip() for p in removed} <= captions  # trained on what was written
    assert outputs["21"][1].splitlines()[-1].startswith(f"8 images in {folder}: 3 written, 0 replaced")
