"""`python -m trainer_core train`: a run from a run file (run_file.py), without a canvas, in one process or many.

    python -m trainer_core train --config run.toml
    torchrun --nproc-per-node 4 -m trainer_core train --config run.toml

The nodes' recipe, step for step: load the model set (model_source), find the dataset folders and cache them,
open the run (`runs.open_run`: it resumes from the run folder's newest checkpoint), train up to [train] steps
(or epochs), and write previews and LoRA snapshots every N steps, then the last step's LoRA, the loss plot and
the losses. Running the same command again resumes where the run stopped, up to the same length.

Ctrl-C or SIGTERM while training stops at the next step boundary: a checkpoint and the LoRA of that step are
written, and the command exits with code 130. A second one, a few seconds later, exits at once (the newest
checkpoint stays). Several processes stop together at one step (`Replicas.any`).

With several processes (distributed.py), process 0 encodes the cache, then the first process of every other
machine encodes what its machine's cache folder lacks (nothing when the machines share the folder), and the others
read their machine's entries; process 0 alone holds the run folder and writes every file (checkpoints, LoRA files,
previews), so the run folder must be one folder every machine sees; each process trains its share of every step.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image

from ..adapters.lora_files import lora_output_path
from ..core.errors import UserInputError
from ..core.files import inside, write_bytes_atomic, write_error
from ..core.names import require_step
from ..data.cache import CachedDataset, build_cache
from ..data.mixture import combined, data_settings, mix
from ..families.comfyui_files import known_file
from ..families.loading import LoadRequest, load_model_set
from ..training import Every, StepExtras, StepReport, Trainer, every
from ..training.distributed import Replicas, lost_peer, lost_peer_message
from ..training.idle_settings import unused_preservation
from ..training.live import StepPreview, keep_preview, step_grid
from ..training.plot import loss_plot
from ..training.weighting import describe
from .agreement import check_same_settings, check_same_start
from .registry import open_run, release
from .run_file import RunFile

STOPPED = 130  # exit code after Ctrl-C / SIGTERM (128 + SIGINT, as shells report it)
PEER_LOST = 1  # exit code when another process of a torchrun run is gone
# A second Ctrl-C within this many seconds of the first is the same request: torchrun's launcher passes the
# signal it got from the terminal on to its processes, which got the terminal's own already.
REPEAT_GRACE_SECONDS = 2.0


class StopRequested(Exception):
    """Ctrl-C or SIGTERM asked the run to stop (raised at a step boundary)."""


class StopSignals:
    """While training: the first SIGINT / SIGTERM asks for a stop at the next step boundary; one more, after
    REPEAT_GRACE_SECONDS, exits at once without writing (the newest checkpoint stays whole)."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self.requested_at: float | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # (only the main thread may set handlers)
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if self.requested_at is None:
            self.requested_at = now
            self.say(f"{signal.Signals(signum).name}: stopping after this step, with a checkpoint "
                     "(again to quit at once without one)")
        elif now - self.requested_at > REPEAT_GRACE_SECONDS:
            self.say("stopped at once: the newest checkpoint stays as it was")
            os._exit(STOPPED)


def train_run(run: RunFile, replicas: Replicas, config_text: str = "", steps: int | None = None,
              log: Callable[[str], None] = print, on_step: Callable[[StepReport], None] | None = None) -> int:
    """Train `run` (see the module docstring); returns the exit code. `steps` replaces [train] steps (and epochs).
    `config_text` is kept in the run folder as config.toml. `on_step` runs after each step (for scripts)."""
    say = log if replicas.writes else (lambda _text: None)
    check_same_settings(run, replicas, steps)  # every process's run file: before any file is read or written
    run_dir = inside(run.output_folder, run.train.run_name, "[train] run_name", "my_lora")
    lora_output_path(run_dir, run.save.filename, run.train.run_name, 0)  # a bad name fails before any work
    if run.steps_cfg.snapshot_every or run.headless.snapshot_every_epochs:  # named by filename: {step}, or overwritten
        require_step(run.save.filename, f"{run.where}: [output] filename", "[output] snapshot_every(_epochs)")
    # The family from the files (families/loading.py): Layered and 2.1 say so in their transformers (2.1: the rest
    # from its folder); with [edit] the run loads as the Load Edit node does (an Edit variant, or 2.1, which reads
    # its datasets as edit datasets then).
    components = load_model_set(LoadRequest(
        run.load.source, replicas.device, storage=run.load.storage, compute_dtype=run.load.compute_dtype,
        transformer=run.load.transformer, text_encoder=run.load.text_encoder, vae=run.load.vae,
        tokenizer=run.headless.tokenizer or None, diffusers_folder=run.load.diffusers_folder,
        text_encoder_fp8=run.load.text_encoder_fp8, edit=run.edit is not None,
        edit_variant=run.edit.variant if run.edit is not None else "auto"))
    known = known_file(run.load.transformer) if run.load.transformer else None  # a file ComfyUI's templates name
    say(f"model: {components.name} ({components.num_blocks} blocks, {components.block_storage} blocks, compute "
        f"{str(components.compute_dtype).removeprefix('torch.')}, {components.device})"
        + (f"; {replicas.size} processes" if replicas.size > 1 else "")
        + (f"; ComfyUI's {known.member} file ({known.storage})" if known is not None else ""))
    cached = cache_once(components, run, replicas, say)
    trainer = open_once(components, cached, run, run_dir, replicas, say)
    try:
        code = _train(trainer, run, run_dir, replicas, config_text, steps, say, on_step)
    finally:
        release(run.train.run_name)  # a checkpoint if one is behind; memory back
    # Every process leaves after process 0 wrote its files. (Not after an error: the process that failed exits,
    # and torchrun ends the others.)
    replicas.wait_for_writer()
    return code


def cache_once(components, run: RunFile, replicas: Replicas, say) -> CachedDataset:
    """Find every dataset folder's images and cache them; with several processes process 0 encodes and the
    others then read its entries (content-addressed: their keys come from their own model set, so a process
    with other model files would miss them, and is stopped)."""
    datasets = []
    for cfg in run.datasets:
        # the family's folder convention (Layered: layers; Edit: controls, sized by [edit] control_resolution)
        datasets.append(components.family.load_dataset(cfg, run.edit.data if run.edit is not None else None))
        say(f"dataset {cfg.folder} at {cfg.resolution} px: {datasets[-1].summary()}")
    samples, validation, per_sample = combined(datasets)
    # The family's data settings, as the Cache node takes them (Edit: control_resolution; one for every dataset)
    settings = data_settings(components.family, datasets[0] if len(datasets) == 1 else mix(datasets))
    preservation = (run.cache.preservation_trigger, run.cache.preservation_class)
    unused = unused_preservation(run.cache.preservation_trigger, run.train.preservation_weight)
    if unused is not None:  # the class captions would be encoded (a real-size text encoder's time) for nothing
        say(f"warning: {unused} Its class captions are not encoded.")
        preservation = ("", "")

    def build(progress=None) -> CachedDataset:
        return build_cache(components, samples, run.cache_folder, preview_prompts=run.preview_prompts,
                           negative_prompt=run.cache.negative_prompt, batch_size=run.cache.caching_batch_size,
                           repeats=per_sample, validation=validation, progress=progress, settings=settings,
                           preservation=preservation if preservation[0].strip() else None)

    if replicas.writes:
        with _Bar("caching") as bar:
            cached = build(bar.update)
        say(f"cache ({run.cache_folder}): {cached.report.summary()}")
    replicas.wait_for_writer()
    # Then the first process of every other machine: it encodes what its machine's cache folder lacks (nothing,
    # where the machines share the folder), one machine after process 0 so that no two write one entry at once.
    if replicas.local_rank == 0 and not replicas.writes:
        cached = build()
    replicas.wait_for_writer()
    if replicas.local_rank != 0:
        cached = build()
        encoded = cached.report.latents_encoded + cached.report.prompts_encoded
        if encoded:
            raise UserInputError(
                f"process {replicas.rank} had to encode {encoded} cache entries that the first process of its machine "
                "had cached: its model files differ from that process's. Every process must load the same model "
                "files.")
    return cached


def open_once(components, cached: CachedDataset, run: RunFile, run_dir: Path, replicas: Replicas, say) -> Trainer:
    """Open the run (resuming from its checkpoint); process 0 first (it locks the run folder and tidies what a
    killed write left there), then the others, which read the same checkpoint; all must then agree."""
    init_lora = run.continue_from_lora or None
    # The memory plan covers the previews this run samples (without previews: the Preview node's default size).
    side = run.steps_cfg.preview_size
    planned_previews = (side, side) if run.steps_cfg.preview_every else None
    trainer = None
    if replicas.writes:
        opened = open_run(components, cached, run.lora, run.optimizer, run.train, run_dir=run_dir,
                          init_lora=init_lora, replicas=replicas, preview_size=planned_previews)
        trainer = opened.trainer
        say(opened.status)
    replicas.wait_for_writer()
    if not replicas.writes:
        trainer = open_run(components, cached, run.lora, run.optimizer, run.train, run_dir=run_dir,
                           init_lora=init_lora, replicas=replicas, preview_size=planned_previews).trainer
    try:
        check_same_start(trainer, replicas, run.where)
    except BaseException:
        release(run.train.run_name)
        raise
    host_copy = trainer.built.host_copy
    if host_copy is not None:  # every process has attached the machine's host copy: only mappings keep it
        host_copy.seal()
    return trainer


def run_length(trainer: Trainer, run: RunFile, steps: int | None) -> tuple[int, float]:
    """(the step the run ends at, steps per epoch). An epoch is every sample times its repeats, in micro-batches;
    a step takes grad_accum_steps of them on each process."""
    per_step = trainer.train_cfg.grad_accum_steps * trainer.replicas.size
    steps_per_epoch = trainer.built.order.batches_per_epoch / per_step
    if steps is not None:
        return steps, steps_per_epoch
    ends = [run.headless.steps] if run.headless.steps else []
    if run.headless.epochs:
        ends.append(math.ceil(run.headless.epochs * steps_per_epoch - 1e-9))
    return min(ends), steps_per_epoch


def _train(trainer: Trainer, run: RunFile, run_dir: Path, replicas: Replicas, config_text: str, steps: int | None,
           say, on_step) -> int:
    end, steps_per_epoch = run_length(trainer, run, steps)
    if run.headless.epochs or run.headless.snapshot_every_epochs:
        say(f"an epoch is {steps_per_epoch:.2f} steps; the run ends at step {end}")
    every_epochs = run.headless.snapshot_every_epochs
    snapshot_epoch_steps = max(1, round(every_epochs * steps_per_epoch)) if every_epochs else 0
    outputs = Outputs(trainer, run, run_dir, say) if replicas.writes else None
    if outputs is not None and config_text:
        outputs.write(config_text.encode(), run_dir / "config.toml", "run file copy")
    if trainer.step >= end:
        say(f"run '{run.train.run_name}' is at step {trainer.step} already (it ends at step {end}): nothing to train. "
            "Raise [train] steps (or pass --steps) to train on.")
        if outputs is not None:
            outputs.finish()
        return 0
    # Previews on the one schedule every host uses (training.periodic.StepExtras): step 0, then every N steps.
    extras = StepExtras(run.steps_cfg.preview_every, make_preview=outputs.previews) if outputs is not None else None
    if extras is not None:
        extras.untrained_preview(trainer)  # the untrained model: what the LoRA changes shows against it
    progress = _Progress(trainer.step, end, say) if replicas.writes else None

    def stop_if_asked(report: StepReport) -> None:
        if replicas.any(stop.requested):  # every process stops after the same step
            raise StopRequested()

    work = [every(1, progress.update, "progress")] if progress is not None else []
    work.append(every(1, stop_if_asked))
    if outputs is not None:
        work += [*extras.work(),
                 # both may be due at one step: Outputs.lora writes a step's file once
                 Every(run.steps_cfg.snapshot_every, lambda *_: outputs.lora(), "snapshot", extra=True),
                 Every(snapshot_epoch_steps, lambda *_: outputs.lora(), "epoch snapshot", extra=True)]
    if on_step is not None:
        work.append(every(1, on_step))

    with StopSignals(say) as stop:
        try:
            trainer.train(end - trainer.step, work=work)
        except StopRequested:
            if progress is not None:
                progress.close()
            if outputs is not None:
                outputs.finish()
            say(f"stopped at step {trainer.step}: its checkpoint and LoRA are written; run the same command to "
                "continue.")
            return STOPPED
        except RuntimeError as e:  # inside StopSignals: torchrun's SIGTERM to the survivors must not cut this short
            if not lost_peer(e, replicas):
                raise
            print(f"error: {lost_peer_message(replicas, trainer)}", file=sys.stderr, flush=True)
            os._exit(PEER_LOST)  # its collectives can never finish: nothing more to do here
        finally:
            if progress is not None:
                progress.close()
    if outputs is not None:
        outputs.finish()
    losses = [loss for _, loss in trainer.progress.loss_history]
    if losses:
        say(f"loss: first step {losses[0]:.4f}, last step {losses[-1]:.4f} (step {trainer.step})")
    return 0


class Outputs:
    """The files of a run, all written by process 0 into its run folder: LoRA files (snapshots and the last one),
    previews, a grid of the first prompt's previews by step, the loss plot and the losses."""

    def __init__(self, trainer: Trainer, run: RunFile, run_dir: Path, say):
        self.trainer, self.run, self.run_dir, self.say = trainer, run, run_dir, say
        self.kept: list[StepPreview] = []
        self.written: list[Path] = []

    def lora(self) -> Path:
        trainer, run = self.trainer, self.run
        path = lora_output_path(self.run_dir, run.save.filename, run.train.run_name, trainer.step)
        if not self.written or self.written[-1] != path:  # the last step's snapshot is the final file too
            trainer.save_lora(path, getattr(torch, run.save.dtype), layout=run.save.layout)
            self.written.append(path)
        return path

    def previews(self, trainer: Trainer) -> StepPreview | None:
        """Every preview prompt at the current step, as PNG files; the first prompt's preview (kept for the grid)
        is returned. Sampling leaves the training untouched: it has its own generator, and training's draws come
        from counters (training/randomness.py)."""
        run, first = self.run, None
        for i, prompt in enumerate(run.preview_prompts):
            started = time.perf_counter()
            image = trainer.sample_preview(prompt, run.cache.negative_prompt, run.steps_cfg.preview_size,
                                           run.steps_cfg.preview_size, run.steps_cfg.preview_sampling_steps,
                                           run.preview.cfg, run.preview.preview_seed)
            path = self.run_dir / "previews" / f"step_{trainer.step:06d}_{i}.png"
            self.write(_png(image), path, "preview image")
            if i == 0:
                first = StepPreview(trainer.step, image, time.perf_counter() - started)
                keep_preview(self.kept, first)
        return first

    def finish(self) -> None:
        """The last step's LoRA, the loss plot, the losses and (with previews) the grid of previews by step."""
        path = self.lora()
        progress = self.trainer.progress
        plot = loss_plot(progress.loss_history, title=self.run.train.run_name, validation=progress.validation_history,
                         datasets=progress.dataset_loss_history, previews=progress.preview_history)
        self.write(_png(plot), self.run_dir / "loss.png", "loss plot")
        history = {"loss": progress.loss_history, "validation_loss": progress.validation_history,
                   **({"dataset_loss": progress.dataset_loss_history} if progress.dataset_loss_history else {}),
                   # (step, moved from the untrained preview, from the previous one): live.PreviewMovement
                   **({"preview_movement": progress.preview_history} if progress.preview_history else {})}
        self.write(json.dumps(history).encode(), self.run_dir / "losses.json", "loss history")
        if self.kept:
            self.write(_png(step_grid(self.kept, title=self.run.train.run_name)), self.run_dir / "previews" /
                       "steps.png", "preview grid")
        self.say(f"lora: {path}")
        self.say(f"loss plot: {self.run_dir / 'loss.png'}")

    def write(self, data: bytes, path: Path, what: str) -> None:
        try:
            write_bytes_atomic(data, path)
        except OSError as e:
            raise write_error(e, what, path, f"The run's checkpoint holds step {self.trainer.step}.") from None


def _png(image: Image.Image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


class _Progress:
    """The training progress: a bar with loss, learning rate and seconds per step on a terminal; a line every
    twentieth of the run (and on the first and last step) otherwise."""

    def __init__(self, start: int, end: int, say):
        self.start, self.end, self.say = start, end, say
        self.seconds: list[float] = []
        self.bar = _bar(total=end, initial=start, unit="step", desc="training")
        self.every = max(1, (end - start) // 20)

    def update(self, report: StepReport) -> None:
        self.seconds = (self.seconds + [report.seconds])[-20:]
        per_step = sum(self.seconds) / len(self.seconds)
        text = f"loss {report.loss:.4f}, lr {report.lr:.2e}, {per_step:.2f} s/step"
        if report.datasets:
            text += f" ({describe(report.datasets)})"
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)
        elif report.step == self.start + 1 or report.step % self.every == 0 or report.step == self.end:
            self.say(f"step {report.step}/{self.end}: {text}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class _Bar:
    """Caching progress (done of total entries) as a bar on a terminal; nothing otherwise."""

    def __init__(self, what: str):
        self.what, self.bar = what, None

    def __enter__(self):
        return self

    def update(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = _bar(total=total, unit="entry", desc=self.what)
        if self.bar is not None:
            self.bar.update(done - self.bar.n)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


def _bar(**kwargs):
    """A tqdm bar on stderr when it is a terminal, else None (a log gets lines, not carriage returns)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(dynamic_ncols=True, **kwargs)
