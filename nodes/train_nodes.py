"""Creating a trainer and training it in chunks of steps."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..trainer_core.core.config import NO_LORA, InitConfig, TrainConfig, TrainStepsConfig, parse_checkpointing
from ..trainer_core.core.errors import UserInputError
from ..trainer_core.runs import registry as runs
from ..trainer_core.training import StepExtras, Trainer, every
from ..trainer_core.training.live import PreviewSettings, for_display, side_by_side
from ..trainer_core.training.plot import dataset_means, loss_plot
from . import host
from .common import CACHED, CATEGORY, LORA_CONFIG, MODELS, OPTIMIZER_CONFIG, TRAINER, engine_mode
from .output_nodes import lora_output_path
from .widgets import widgets

log = logging.getLogger("qwen_lora")

TRAIN_WIDGETS = (
    "run_name", "micro_batch_size", "grad_accum_steps", "gradient_checkpointing", "blocks_to_swap", "seed",
    "timestep_sampling", "logit_mean", "logit_std", "resolution_shift", "caption_dropout", "checkpoint_every",
    "max_nonfinite_steps",
)
LATER_TRAIN_WIDGETS = ("validation_every", "fp8_activations", "compile_float8", "preservation_weight",
                       "int8_compute", "fused_blocks", "attention_backend")
# The seed widget is called training_seed: ComfyUI gives any INT input named "seed" a "randomize after
# queue" control, which would change the seed, hence start a new run, on every queue.
WIDGET_NAMES = {"seed": "training_seed"}


def run_directory(run_name: str) -> Path:
    """Where a run's checkpoints live: inside ComfyUI's output folder, one folder per run name."""
    return runs.run_folder(host.output_directory(), run_name)


class QwenLoRAInitTrainer:
    DESCRIPTION = (
        "Creates the trainer (LoRA on the transformer, optimizer, schedule, data order) or, when a trainer of "
        "this run name built from the same inputs is alive, hands that one on so training continues. One loaded "
        "model trains one run at a time: starting another run on it checkpoints and retires the first."
    )
    CATEGORY = CATEGORY
    FUNCTION = "init"
    RETURN_TYPES = (TRAINER, "STRING")
    RETURN_NAMES = ("trainer", "status")
    OUTPUT_TOOLTIPS = ("Feeds Train Steps, Preview, Loss Plot and Save LoRA.", "Whether it started or continued.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "models": (MODELS, {"tooltip": "From Load Qwen-Image (training)."}),
            "cached_dataset": (CACHED, {"tooltip": "From the Cache node."}),
            "lora_config": (LORA_CONFIG, {"tooltip": "From the LoRA Config node."}),
            "optimizer_config": (OPTIMIZER_CONFIG, {"tooltip": "From the Optimizer node."}),
            **widgets(TrainConfig, *TRAIN_WIDGETS, rename=WIDGET_NAMES),
            **widgets(InitConfig, "continue_from_lora"),
        },
            # Newer widgets go last (a saved canvas workflow stores widget values by position) and are
            # optional (an API workflow written before them still validates; they take their defaults).
            "optional": widgets(TrainConfig, *LATER_TRAIN_WIDGETS),
        }

    @classmethod
    def VALIDATE_INPUTS(cls, gradient_checkpointing="auto"):
        # Naming the input here makes ComfyUI leave its list check to us: a workflow saved while the widget was a
        # true/false switch still queues (true = on, false = off; TrainConfig reads both).
        try:
            parse_checkpointing(gradient_checkpointing)
        except UserInputError as e:
            return str(e)
        return True

    @classmethod
    def IS_CHANGED(cls, run_name="", **_):
        # Run again once the run's trainer was retired or released, so the next queue rebuilds it, and once it
        # trained further, so the status on the canvas says the step it continues at (it hands on the same live
        # trainer: nothing is rebuilt). Unchanged, ComfyUI keeps its cached output.
        trainer = runs.find(run_name)
        return f"{runs.changes(run_name)}|{trainer.step if trainer is not None else '-'}"

    def init(self, models, cached_dataset, lora_config, optimizer_config, continue_from_lora=NO_LORA, **widget_values):
        names = {widget: field for field, widget in WIDGET_NAMES.items()}
        train_cfg = TrainConfig(**{names.get(k, k): v for k, v in widget_values.items()})
        init_lora = None if continue_from_lora == NO_LORA else host.model_file_path("loras", continue_from_lora)
        with engine_mode():
            run = runs.open_run(models, cached_dataset, lora_config, optimizer_config, train_cfg,
                                run_dir=run_directory(train_cfg.run_name), init_lora=init_lora,
                                before_build=host.free_host_models,  # 'auto' swapping plans on a freed GPU
                                exclusive=True)  # one GPU, one training: an earlier model set's run lets go
        log.info("[qwen-lora] %s", run.status)
        return (run.trainer, canvas_status(run.status, run.trainer.run_dir))


PLAN_FILE = "memory_plan.txt"  # the whole memory plan, in the run folder (the canvas shows its verdict)
PLAN_LINES_SHOWN = 3  # a plan this short (a CPU's one line) is shown whole


def canvas_status(status: str, run_dir: Path | None) -> str:
    """Init Trainer's status as its box on the canvas shows it: what happened, the model, the swap count and the
    memory plan's verdict; a GPU's plan (~45 lines) goes whole into the run folder's memory_plan.txt and ComfyUI's
    console."""
    head, _, plan = status.partition("\n\n")
    lines = [line for line in plan.splitlines() if line.strip()]
    if len(lines) <= PLAN_LINES_SHOWN:
        return status
    where = "ComfyUI's console"
    if run_dir is not None:
        try:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            (Path(run_dir) / PLAN_FILE).write_text(plan + "\n", encoding="utf-8")
            where = f"{Path(run_dir) / PLAN_FILE} and ComfyUI's console"
        except OSError as e:  # the plan is still in the console; the run goes on
            log.warning("[qwen-lora] memory plan not written to %s: %s", run_dir, e)
    budget = next((" ".join(line.split()) for line in lines if line.startswith("budget")), "")
    verdict = lines[-1] + (f" (GPU at the training peak: {budget})" if budget else "")
    return f"{head}\nmemory plan: {verdict}; the whole plan: {where}"


class QwenLoRARelease:
    DESCRIPTION = (
        "Gives the run's memory back so ComfyUI can load its own models in this canvas: checkpoints the run, "
        "drops its LoRA and optimizer from the GPU, frees its pinned RAM and moves the loaded model to the CPU. "
        "Queue again and Init Trainer resumes the run from its checkpoint."
    )
    CATEGORY = CATEGORY
    FUNCTION = "release"
    OUTPUT_NODE = True
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("status",)
    OUTPUT_TOOLTIPS = ("What was released.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {"trainer": (TRAINER, {"tooltip": "From Train Steps: the run to release."})},
            # ComfyUI runs a node after every node it takes an input from: wiring Save LoRA's path and the
            # Preview image here makes the release come after them in the queue.
            "optional": {
                "saved_lora": ("STRING", {"forceInput": True, "tooltip": "Save LoRA's path: release after saving."}),
                "preview": ("IMAGE", {"tooltip": "A Preview image: release after previewing."}),
            },
        }

    @classmethod
    def IS_CHANGED(cls, **_):
        return float("nan")  # a release is an action: do it on every queue

    def release(self, trainer, saved_lora=None, preview=None):
        with engine_mode():
            status = runs.release(trainer.train_cfg.run_name) if trainer.live else \
                f"run '{trainer.train_cfg.run_name}' holds no memory: {trainer.retired_reason}"
        log.info("[qwen-lora] %s", status)
        return {"ui": {"text": [status]}, "result": (status,)}


class QwenLoRATrain:
    DESCRIPTION = (
        "Trains the LoRA for N more steps. Runs on every queue: queue again to continue where it stopped. "
        "Cancel stops at the next step boundary with everything trained so far kept. Shows the loss plot while "
        "it trains and, with preview_every, a preview of the first preview prompt beside it; snapshot_every "
        "saves the LoRA every N steps."
    )
    CATEGORY = CATEGORY
    FUNCTION = "train"
    RETURN_TYPES = (TRAINER, "FLOAT", "STRING")
    RETURN_NAMES = ("trainer", "loss", "report")
    OUTPUT_TOOLTIPS = ("The same trainer, N steps further.", "Mean loss of this chunk.", "Steps, losses, speed.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "trainer": (TRAINER, {"tooltip": "From Init Trainer or another Train Steps node."}),
            **widgets(TrainStepsConfig, "steps", "preview_every", "preview_size", "preview_sampling_steps",
                      "snapshot_every"),
        }}

    @classmethod
    def IS_CHANGED(cls, **_):
        return float("nan")  # never equal to itself: the node runs on every queue

    def train(self, trainer: Trainer, steps: int, preview_every: int = 0, preview_size: int = 512,
              preview_sampling_steps: int = 20, snapshot_every: int = 0):
        cfg = TrainStepsConfig(steps, preview_every, preview_size, preview_sampling_steps, snapshot_every)
        trainer.require_live()
        if steps == 0:  # captions and cache only (workflow 7's first queue): nothing trains, nothing is sampled
            return (trainer, trainer.last_loss(), f"0 steps: nothing trained this queue; the run is at step "
                                                  f"{trainer.step}. Set steps above 0 and queue again to train.")
        extras = step_extras(trainer, cfg)
        trainer.schedule_previews(extras)  # the run's live preview schedule: Compare Steps says when the first comes
        with engine_mode():
            extras.untrained_preview(trainer)  # Compare Steps' first tile: the model before the LoRA trained
        progress = host.Progress(steps)
        first = trainer.step
        plot_every = max(1, steps // 20)
        last_log = [time.monotonic()]
        latest = [for_display(trainer.step_previews[-1].image, LIVE_PREVIEW_SIDE)
                  if preview_every and trainer.step_previews else None]

        def on_step(report):
            done = report.step - first
            if report.preview is not None:
                latest[0] = for_display(report.preview.image, LIVE_PREVIEW_SIDE)
                log.info("[qwen-lora] %s step %d: preview in %.2fs", trainer.train_cfg.run_name, report.step,
                         report.preview.seconds)
            if report.snapshot is not None:
                log.info("[qwen-lora] %s step %d: LoRA snapshot %s", trainer.train_cfg.run_name, report.step,
                         report.snapshot)
            image = None
            if done % plot_every == 0 or done == steps or report.preview is not None:
                image = live_image(trainer, latest[0])
            if time.monotonic() - last_log[0] > 10 or done == steps:
                log.info("[qwen-lora] %s step %d (%d/%d) loss %.4f lr %.2e %.2fs/step", trainer.train_cfg.run_name,
                         report.step, done, steps, report.loss, report.lr, report.seconds)
                last_log[0] = time.monotonic()
            progress.update(done, image)  # shown at its own size; raises ComfyUI's interrupt at this step boundary

        with engine_mode():
            report = trainer.train(steps, work=[*extras.work(), every(1, on_step)])
        run = trainer.progress  # (`progress` is ComfyUI's progress bar here)
        return (trainer, report.mean_loss, report_text(report, trainer.last_loss(), run.validation_history,
                                                        run.dataset_loss_history, run.preview_history,
                                                        trainer.preview_notes))


# The live image: the newest preview (fit to this many pixels a side: a larger one scaled down, a small model's 64 px
# one enlarged 8x, nearest neighbour) beside a loss plot of this width and the preview's height.
LIVE_PREVIEW_SIDE = 512
LIVE_PLOT_WIDTH = 512


def step_extras(trainer: Trainer, cfg: TrainStepsConfig) -> StepExtras:
    """Train Steps' widgets as the engine's every-N-steps work."""
    preview = None
    if cfg.preview_every:
        prompts = trainer.dataset.preview_prompts
        if not prompts:
            raise UserInputError("preview_every needs a preview prompt: add one to the Cache node's preview prompts "
                                 "(or set preview_every to 0).")
        preview = PreviewSettings(prompts[0], trainer.dataset.negative_prompt, cfg.preview_size,
                                  cfg.preview_sampling_steps)
    snapshot_path = None
    if cfg.snapshot_every:
        folder, run_name = host.loras_directory(), trainer.train_cfg.run_name
        snapshot_path = lambda step: lora_output_path(folder, SNAPSHOT_NAME, run_name, step)  # noqa: E731
    return StepExtras(cfg.preview_every, preview, cfg.snapshot_every, snapshot_path,
                      on_sampling_step=lambda i, n: host.check_interrupt())  # Cancel also stops a preview


SNAPSHOT_NAME = "{run_name}_{step}"  # the Save node's default name: snapshots sort with saved files


def live_image(trainer: Trainer, preview):
    """The loss plot, with the newest preview beside it when there is one."""
    height = max(256, preview.height) if preview is not None else 256
    progress = trainer.progress
    plot = loss_plot(progress.loss_history, LIVE_PLOT_WIDTH, height, title=trainer.train_cfg.run_name,
                     validation=progress.validation_history, datasets=progress.dataset_loss_history,
                     previews=progress.preview_history)
    return side_by_side(preview, plot) if preview is not None else plot


REPORT_LIST_MAX = 8  # previews or snapshots listed one by one in the report; more are summed up


def report_text(report, last_loss: float, validation_history=(), dataset_history=(), preview_history=(),
                preview_notes=()) -> str:
    text = (f"steps {report.first_step}-{report.last_step}: mean loss {report.mean_loss:.4f}, "
            f"last {last_loss:.4f}, {report.step_seconds:.2f} s/step")
    means = dataset_means(dataset_history, report.first_step)  # several or weighted datasets: each one's mean
    if means:
        text += "; per dataset: " + ", ".join(f"{label} {value:.4f}" for label, value in means.items())
    if validation_history:
        step, value = validation_history[-1]
        text += f"; validation loss {value:.4f} at step {step}"
    if report.previews:
        steps = [step for step, _ in report.previews]
        seconds = [s for _, s in report.previews]
        if len(steps) <= REPORT_LIST_MAX:
            text += (f"\npreviews at steps {', '.join(map(str, steps))}: {sum(seconds) / len(seconds):.2f} s each "
                     f"({', '.join(f'{s:.2f}' for s in seconds)} s)")
        else:
            text += (f"\n{len(steps)} previews, steps {steps[0]} to {steps[-1]}: {sum(seconds) / len(seconds):.2f} s "
                     f"each ({min(seconds):.2f} to {max(seconds):.2f} s)")
    moved = [h for h in preview_history if report.first_step <= h[0] <= report.last_step and h[0] > 0]
    if moved:  # the newest preview's movement (live.PreviewMovement): a collapse moves far from both at once
        step, from_untrained, from_previous = moved[-1]
        text += (f"\npreview at step {step} moved {_share(from_untrained)} from the untrained one and "
                 f"{_share(from_previous)} from the one before (mean absolute difference, 0-1)")
        if from_untrained is None or from_previous is None:  # say why a measure is missing, never just "unknown"
            text += "; " + "; ".join(preview_notes or ["the picture it compares with was made after the last "
                                                       "checkpoint or at another preview_size"])
    if report.snapshots:
        names = [p.name for p in report.snapshots]
        shown = names if len(names) <= REPORT_LIST_MAX else [names[0], "...", names[-1]]
        text += f"\nLoRA snapshots ({len(names)}): {', '.join(shown)}"
    return text


def _share(value) -> str:
    return "(not measured)" if value is None else f"{value:.3f}"
