"""Live previews while Train Steps runs, the Compare Steps grid, and LoRA snapshots every N steps, with the
stand-in host (tests/host_standin.py) recording what the node shows through ComfyUI's progress preview."""

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

import host_standin
from comfy_lora_rules import comfy_key_map, unmatched_keys
from conftest import pack_module
from graph_runner import GraphRunner
from test_nodes import tiny_prompt


def adapter(trainer):
    return {n: p.detach().clone() for n, p in zip(trainer.built.param_names, trainer.built.params)}


def with_compare(prompt, columns=0, tile_size=64):
    prompt["16"] = {"class_type": "QwenLoRACompareSteps",
                    "inputs": {"trainer": ["7", 0], "columns": columns, "tile_size": tile_size}}
    return prompt


def test_previews_arrive_while_train_steps_runs_and_the_report_has_their_seconds(pack, tmp_path, demo_folder,
                                                                                  monkeypatch):
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    _, state = host_standin.install(monkeypatch)
    train_nodes = pack_module(pack, "nodes.train_nodes")
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    prompt = with_compare(tiny_prompt(tmp_path, demo_folder, steps=5, **{"7": {"preview_every": 2}}))
    outputs = runner.run(prompt)
    trainer, report = outputs["7"][0], outputs["7"][2]
    assert trainer.step == 5

    # The engine sampled the untrained model first (step 0: what the LoRA changes shows against it), then at
    # steps 2 and 4 (every 2 steps of the run), and kept small copies.
    assert [p.step for p in trainer.step_previews] == [0, 2, 4]
    assert all(p.image.size == (64, 64) for p in trainer.step_previews)
    # The report names them with the seconds each cost (values vary; their presence does not).
    lines = report.splitlines()
    assert lines[1].startswith("previews at steps 2, 4: ") and " s each (" in lines[1], report

    # How far each preview moved (issue 41: a collapsing run moves far while its loss says little): the mean absolute
    # difference of its pixels (0-1) from the untrained preview's and from the previous one's; 0 at step 0.
    def moved(a, b):
        a, b = (np.asarray(p.image.convert("RGB"), dtype=np.float64) for p in (a, b))
        return float(np.abs(a - b).mean() / 255.0)

    p0, p2, p4 = trainer.step_previews
    history = trainer.progress.preview_history
    assert [h[0] for h in history] == [0, 2, 4] and history[0] == (0, 0.0, None)
    expected = [(moved(p2, p0), moved(p2, p0)), (moved(p4, p0), moved(p4, p2))]
    for (_, from_untrained, from_previous), (want_untrained, want_previous) in zip(history[1:], expected):
        assert from_untrained == pytest.approx(want_untrained, rel=1e-12, abs=1e-15)
        assert from_previous == pytest.approx(want_previous, rel=1e-12, abs=1e-15)
    assert expected[1][0] > 0  # the LoRA moved the picture
    assert lines[2] == (f"preview at step 4 moved {history[2][1]:.3f} from the untrained one and {history[2][2]:.3f} "
                        "from the one before (mean absolute difference, 0-1)"), report

    # What the node showed through ComfyUI's progress preview: Train Steps' bar (total 5) updated after each
    # step with an image: the newest preview (from step 1 on the untrained one) beside the loss plot.
    frames = [(value, image) for value, total, (kind, image, max_size) in state["previews"] if total == 5]
    assert [value for value, _ in frames] == [1, 2, 3, 4, 5]
    # The 64 px preview is shown enlarged 8x (to LIVE_PREVIEW_SIDE, nearest neighbour), the plot as tall beside it.
    side = train_nodes.LIVE_PREVIEW_SIDE
    assert side == 8 * 64
    composite = side + 8 + train_nodes.LIVE_PLOT_WIDTH
    assert [image.size for _, image in frames] == [(composite, side)] * 5
    # Shown at its own size: ComfyUI scales a preview to fit max_size, up as well as down.
    assert all(max_size == max(image.size) for _, _, (_, image, max_size) in state["previews"])

    def left_tile(image):
        """The preview as sampled: every 8x8 block of the shown one is one pixel of it."""
        shown = np.asarray(image.crop((0, 0, side, side)).convert("RGB"))
        pixels = shown[::8, ::8]
        assert np.array_equal(shown, pixels.repeat(8, axis=0).repeat(8, axis=1))
        return pixels

    shown = [left_tile(image) for value, image in frames if value in (1, 2, 4)]
    for tile, kept in zip(shown, trainer.step_previews):
        assert np.array_equal(tile, np.asarray(kept.image.convert("RGB")))
    # The loss plot beside them draws the movement on its second axis once a preview after step 0 exists.
    plot_colours = [set(map(tuple, np.asarray(image.crop((side + 8, 0, composite, side)).convert("RGB")).reshape(-1, 3)))
                    for _, image in frames]
    untrained_colour = pack_module(pack, "trainer_core.training.plot").FROM_UNTRAINED
    assert [untrained_colour in colours for colours in plot_colours] == [False, True, True, True, True]
    # Frames between samples keep showing the newest one (step 3 shows step 2's).
    assert np.array_equal(left_tile(frames[2][1]), shown[1])
    # Compare Steps: one tile per preview (64 px, 2 columns: 3 tiles about square), each labelled under it.
    grid = outputs["16"][0]
    assert grid.shape == (1, 2 * (64 + 20), 2 * 64, 3)
    pixels = (grid[0].numpy() * 255).astype(np.uint8)
    for i in range(3):
        row, column = divmod(i, 2)
        y = row * (64 + 20)
        tile = pixels[y:y + 64, column * 64:(column + 1) * 64]
        assert np.array_equal(tile, np.asarray(trainer.step_previews[i].image.convert("RGB")))
        label = pixels[y + 64:y + 84, column * 64:(column + 1) * 64]
        assert (label < 128).any(), "no step label under the tile"

    # A second queue (steps 6-10) continues, with no second untrained preview: the grid holds every preview of
    # the run, 6 tiles in 3 columns.
    outputs = runner.run(prompt)
    assert [p.step for p in outputs["7"][0].step_previews] == [0, 2, 4, 6, 8, 10]
    assert outputs["16"][0].shape == (1, 2 * (64 + 20), 3 * 64, 3)


def test_train_steps_and_train_config_preview_at_the_steps_of_the_one_scheduler(pack, tmp_path, demo_folder,
                                                                                monkeypatch):
    """Train Steps and `train --config` schedule their previews through one mechanism (training.periodic.StepExtras):
    the untrained model at step 0, then every preview_every steps of the run. With the same settings both preview
    at exactly the steps its `preview_due` names (what a preview is stays the host's: one kept image, or files)."""
    from test_headless import tiny_run_file
    from trainer_core.runs.cli import main
    from trainer_core.training import StepExtras
    from trainer_core.training.live import PreviewSettings

    steps, every = 7, 3
    scheduled = [s for s in range(steps + 1) if StepExtras(every, PreviewSettings("a red circle")).preview_due(s)]
    assert scheduled == [0, 3, 6]

    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    host_standin.install(monkeypatch)
    outputs = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(
        tiny_prompt(tmp_path, demo_folder, steps=steps, **{"7": {"preview_every": every}}))
    assert [p.step for p in outputs["7"][0].step_previews] == scheduled

    path = tiny_run_file(tmp_path / "headless", demo_folder, train={"steps": steps},
                         previews={"preview_prompts": ["a red circle", "a blue square"], "preview_every": every,
                                   "preview_size": 64, "preview_sampling_steps": 2})
    assert main(["train", "--config", str(path), "--output", str(tmp_path / "out")]) == 0
    written = sorted(p.name for p in (tmp_path / "out" / "t" / "previews").glob("step_*"))
    assert written == [f"step_{s:06d}_{i}.png" for s in scheduled for i in (0, 1)]


def test_the_live_preview_schedule_is_the_trainers_own_state(pack, tmp_path, demo_folder, monkeypatch):
    """Train Steps hands its schedule to the trainer (`schedule_previews`), where it is declared with the rest of the
    trainer's shape; Compare Steps reads it from there."""
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    host_standin.install(monkeypatch)
    runs = pack_module(pack, "trainer_core.runs.registry")
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    prompt = with_compare(tiny_prompt(tmp_path, demo_folder, steps=2, **{"7": {"preview_every": 2}}))
    outputs = runner.run(prompt)
    trainer = outputs["7"][0]
    assert trainer.preview_every == 2 and [p.step for p in trainer.step_previews] == [0, 2]
    prompt["7"]["inputs"]["preview_every"] = 0
    assert runner.run(prompt)["7"][0].preview_every == 0  # the schedule its host set last
    runs.release(prompt["6"]["inputs"]["run_name"])


def test_step_labels_are_drawn_from_the_step_numbers():
    """Two grids that differ only in their step numbers differ only in the label strip."""
    from trainer_core.training.live import StepPreview, step_grid

    image = Image.new("RGB", (64, 64), (200, 30, 30))
    a = np.asarray(step_grid([StepPreview(10, image, 0.0)], tile=64))
    b = np.asarray(step_grid([StepPreview(20, image, 0.0)], tile=64))
    assert np.array_equal(a[:64], b[:64]) and not np.array_equal(a[64:], b[64:])
    empty = step_grid([], tile=64)
    assert empty.width >= 64  # a message instead of an error when there are no previews yet


def test_small_previews_are_enlarged_for_display_pixel_for_pixel():
    """A small model's 64 px preview in a 256 px tile (and in the live image) is enlarged 4x by nearest neighbour:
    each pixel a 4x4 block, no colour that was not sampled; a larger preview is scaled down to fit as before."""
    from trainer_core.training.live import StepPreview, for_display, step_grid

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    grid = np.asarray(step_grid([StepPreview(10, image, 0.0)], tile=256))
    assert np.array_equal(grid[:256, :256], pixels.repeat(4, axis=0).repeat(4, axis=1))
    assert for_display(image, 100).size == (64, 64)  # under 2x: as sampled
    assert for_display(Image.new("RGB", (1024, 512)), 512).size == (512, 256)


def transparent_preview() -> Image.Image:
    """A 16 x 16 RGBA picture: a red opaque left half, a fully transparent right half (its colour black), a
    half-transparent blue top row."""
    rgba = np.zeros((16, 16, 4), np.uint8)
    rgba[:, :8] = (255, 0, 0, 255)
    rgba[0] = (0, 0, 255, 128)
    return Image.fromarray(rgba, "RGBA")


def test_a_transparent_preview_gives_comfyuis_image_and_mask_and_shows_on_a_checkerboard(pack):
    """A Qwen-Image 2.1 preview (RGBA) reaches the canvas as Load Image gives a PNG with alpha: IMAGE the colours as
    they are, MASK = 1 - alpha; Compare Steps and the live image show transparent pixels as a checkerboard (white and
    light grey squares), opaque ones as they are; an opaque preview's mask is all 0."""
    from trainer_core.data.pixels import CHECKER
    from trainer_core.training.live import StepPreview, step_grid

    common = pack_module(pack, "nodes.common")
    picture = transparent_preview()
    image, mask = common.pil_to_image_and_mask(picture)
    rgba = np.asarray(picture, dtype=np.float32) / 255.0
    assert image.shape == (1, 16, 16, 3) and mask.shape == (1, 16, 16)
    assert np.array_equal(image[0].numpy(), rgba[..., :3]) and np.array_equal(mask[0].numpy(), 1.0 - rgba[..., 3])
    _, opaque_mask = common.pil_to_image_and_mask(picture.convert("RGB"))
    assert not opaque_mask.any()

    tile = 16 * 8  # enlarged 8x: each sampled pixel an 8 x 8 block, the board's squares 8 px
    grid = np.asarray(step_grid([StepPreview(10, picture, 0.0)], tile=tile)).astype(int)  # (H, W, 3)
    right = grid[8:tile, tile // 2:tile]  # the transparent half, under the top row
    squares = {tuple(right[y, x]) for y in range(0, right.shape[0], CHECKER) for x in range(0, right.shape[1], CHECKER)}
    assert squares == {(255, 255, 255), (204, 204, 204)}
    assert {tuple(p) for p in grid[8:tile, :tile // 2].reshape(-1, 3)} == {(255, 0, 0)}
    top = {tuple(p) for p in grid[:8, :tile].reshape(-1, 3)}  # half blue over white or grey
    assert top <= {(127, 127, 255), (128, 128, 255), (102, 102, 229), (102, 102, 230)}, top


def test_preview_movement_counts_alpha_when_a_preview_has_it():
    """The movement of RGBA previews is the mean absolute difference over R, G, B and alpha (an opaque picture's
    alpha is 255): a preview whose background turns transparent has moved, even where its colours did not."""
    from trainer_core.training.live import image_difference

    picture = transparent_preview()
    opaque = picture.copy()
    opaque.putalpha(255)
    a, b = np.asarray(picture, dtype=np.float64), np.asarray(opaque, dtype=np.float64)
    assert image_difference(picture, opaque) == pytest.approx(np.abs(a - b).mean() / 255.0, abs=1e-12)
    assert image_difference(picture, opaque.convert("RGB")) == image_difference(picture, opaque)
    assert image_difference(picture, picture) == 0.0


def test_previews_leave_training_bit_identical(pack, tmp_path, demo_folder, monkeypatch):
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    runs = pack_module(pack, "trainer_core.runs.registry")
    results = {}
    for every in (0, 1):
        prompt = tiny_prompt(tmp_path, demo_folder, steps=3, **{"7": {"preview_every": every},
                                                                "6": {"run_name": f"bitexact_{every}"}})
        trainer = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)["7"][0]
        results[every] = (adapter(trainer), list(trainer.progress.loss_history))
        runs.release(f"bitexact_{every}")
    (plain, plain_losses), (previewed, previewed_losses) = results[0], results[1]
    assert plain_losses == previewed_losses
    assert all(torch.equal(plain[k], previewed[k]) for k in plain)


def test_lora_snapshots_every_n_steps_into_the_loras_folder_load(pack, tmp_path, demo_folder, monkeypatch):
    loras = tmp_path / "loras"
    monkeypatch.setenv("QWEN_LORA_LORAS", str(loras))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    prompt = tiny_prompt(tmp_path, demo_folder, steps=5, **{"7": {"snapshot_every": 2}})
    run_name = prompt["6"]["inputs"]["run_name"]
    snapshots = {}
    outputs = runner.run(prompt)
    trainer, report = outputs["7"][0], outputs["7"][2]
    names = sorted(p.name for p in loras.glob("*.safetensors"))
    # Steps 2 and 4 as snapshots, step 5 from the Save node (same naming: they sort together).
    assert names == [f"{run_name}_000002.safetensors", f"{run_name}_000004.safetensors",
                     f"{run_name}_000005.safetensors"]
    assert f"LoRA snapshots (2): {run_name}_000002.safetensors, {run_name}_000004.safetensors" in report

    lora_reading = pack_module(pack, "trainer_core.adapters.lora_reading")
    base_keys = {k.replace(".base_layer", "") for k in trainer.components.transformer.state_dict() if ".lora_" not in k}
    for step in (2, 4):
        path = loras / f"{run_name}_{step:06d}.safetensors"
        # ComfyUI's LoRA loaders match every key; our reader loads it; its metadata says the step.
        assert unmatched_keys(load_file(str(path)).keys(), comfy_key_map(base_keys)) == []
        read = lora_reading.read_lora_file(path)
        assert read.steps == step and read.rank == trainer.lora_cfg.rank
        with safe_open(str(path), "pt") as f:
            assert f.metadata()["qwen_lora.run_name"] == run_name
        snapshots[step] = read
    # Snapshots differ from each other (training moved the weights between them).
    a, b = snapshots[2].weights, snapshots[4].weights
    assert any(not torch.equal(a[k][1], b[k][1]) for k in a)


def test_engine_previews_every_n_steps_change_nothing_and_stop_on_cancel(demo_folder, tmp_path):
    """The engine on its own (what the command line can reuse): previews every 2 steps with LoRA dropout on
    leave the weights bit-identical; a cancel raised between two sampling steps of a preview stops training at
    that step boundary, and the trainer trains on afterwards."""
    from test_trainer import assert_same_adapter, make_trainer
    from trainer_core.training.live import PreviewSettings
    from trainer_core.training import StepExtras

    settings = PreviewSettings("a red circle on a white background", size=32, steps=2, cfg=1.0)
    plain = make_trainer(tmp_path / "cache", demo_folder)
    plain.train(4)
    seen = []
    previewed = make_trainer(tmp_path / "cache", demo_folder)
    report = previewed.train(4, on_step=lambda r: seen.append((r.step, r.preview is not None)),
                             work=StepExtras(preview_every=2, preview=settings).work())
    assert seen == [(1, False), (2, True), (3, False), (4, True)]
    assert [step for step, _ in report.previews] == [2, 4] and all(s >= 0 for _, s in report.previews)
    assert_same_adapter(plain, previewed)
    assert plain.progress.loss_history == previewed.progress.loss_history
    plain.close()

    class Cancel(Exception):
        pass

    calls = []

    def cancel_in_preview(i, n):
        calls.append((i, n))
        raise Cancel()

    try:
        previewed.train(4, work=StepExtras(preview_every=2, preview=settings, on_sampling_step=cancel_in_preview).work())
    except Cancel:
        pass
    else:
        raise AssertionError("the cancel did not stop training")
    assert calls == [(1, 2)] and previewed.step == 6  # stopped in step 6's preview, after its first sampling step
    assert previewed.train(1).last_step == 7
    previewed.close()


def test_a_long_report_sums_up_previews_and_snapshots(pack):
    from pathlib import Path

    from trainer_core.training import TrainReport

    train_nodes = pack_module(pack, "nodes.train_nodes")

    report = TrainReport(first_step=1, last_step=100, losses=[0.5] * 100, seconds=30.0, extra_seconds=20.0,
                         previews=[(s, 1.0 + s / 100) for s in range(5, 101, 5)],
                         snapshots=[Path(f"run_{s:06d}.safetensors") for s in range(10, 101, 10)])
    lines = train_nodes.report_text(report, last_loss=0.5).splitlines()
    assert lines[0].endswith("0.10 s/step")  # previews and snapshots left out
    assert lines[1].startswith("20 previews, steps 5 to 100: ") and "(1.05 to 2.00 s)" in lines[1]
    assert lines[2] == "LoRA snapshots (10): run_000010.safetensors, ..., run_000100.safetensors"


def test_a_resumed_run_keeps_its_untrained_preview_and_its_history(pack, tmp_path, demo_folder, monkeypatch):
    """Train with previews and a checkpoint, drop the trainer (another run took the model: its memory released), queue
    again: Init Trainer resumes from the checkpoint, and Compare Steps still starts at step 0, the next preview is
    measured from the same untrained picture (issue 53: the report said "(unknown)" and the grid began after the
    resume)."""
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    host_standin.install(monkeypatch)
    runs = pack_module(pack, "trainer_core.runs.registry")
    prompt = with_compare(tiny_prompt(tmp_path, demo_folder, steps=4, **{"7": {"preview_every": 2},
                                                                          "6": {"checkpoint_every": 4}}))
    first = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)["7"][0]
    before = {p.step: np.asarray(p.image.convert("RGB")) for p in first.step_previews}
    assert sorted(before) == [0, 2, 4]
    runs.release(prompt["6"]["inputs"]["run_name"])  # the trainer is gone; its checkpoint of step 4 stays

    outputs = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)  # a fresh graph: nothing cached
    assert outputs["6"][1].startswith("resumed run") and "at step 4" in outputs["6"][1]
    trainer, report = outputs["7"][0], outputs["7"][2]
    assert trainer is not first and trainer.step == 8
    assert [p.step for p in trainer.step_previews] == [0, 2, 4, 6, 8]
    for step, pixels in before.items():  # the previews before the resume, as they were made
        kept = next(p for p in trainer.step_previews if p.step == step)
        assert np.array_equal(np.asarray(kept.image.convert("RGB")), pixels)
    p0 = np.asarray(trainer.step_previews[0].image.convert("RGB"), dtype=np.float64)
    p6, p8 = (np.asarray(trainer.step_previews[i].image.convert("RGB"), dtype=np.float64) for i in (3, 4))
    history = dict((s, (u, p)) for s, u, p in trainer.progress.preview_history)
    assert history[8][0] == pytest.approx(float(np.abs(p8 - p0).mean() / 255.0), rel=1e-12, abs=1e-15)
    assert history[8][1] == pytest.approx(float(np.abs(p8 - p6).mean() / 255.0), rel=1e-12, abs=1e-15)
    assert history[6][1] is not None  # step 6 measured from step 4's picture, kept in the run folder at full size
    assert f"preview at step 8 moved {history[8][0]:.3f} from the untrained one" in report
    assert outputs["16"][0].shape[2] == 3 * 64  # Compare Steps: 5 tiles in 3 columns, step 0 first
    runs.release(prompt["6"]["inputs"]["run_name"])


def test_a_resumed_run_says_why_its_earlier_previews_are_missing(pack, tmp_path, demo_folder, monkeypatch):
    """Previews turned on only after the resume: there is no untrained picture to measure from, and the report says
    so instead of "unknown"."""
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    host_standin.install(monkeypatch)
    runs = pack_module(pack, "trainer_core.runs.registry")
    prompt = tiny_prompt(tmp_path, demo_folder, steps=2, **{"6": {"checkpoint_every": 2}})
    GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)
    runs.release(prompt["6"]["inputs"]["run_name"])
    prompt["7"]["inputs"]["preview_every"] = 2
    outputs = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)
    trainer, report = outputs["7"][0], outputs["7"][2]
    assert [p.step for p in trainer.step_previews] == [4]
    assert "moved (not measured) from the untrained one" in report
    assert "previews were off then" in report
    runs.release(prompt["6"]["inputs"]["run_name"])
