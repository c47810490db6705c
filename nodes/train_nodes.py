"""Creating a trainer and training it in chunks of steps."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

from ..trainer_core import registry
from ..trainer_core.config import NO_LORA, InitConfig, TrainConfig, TrainStepsConfig, check_run_name, to_dict
from ..trainer_core.plot import loss_plot
from ..trainer_core.trainer import Trainer
from . import host
from .common import CACHED, CATEGORY, LORA_CONFIG, MODELS, OPTIMIZER_CONFIG, TRAINER, engine_mode
from .widgets import widgets

log = logging.getLogger("qwen_lora")

TRAIN_WIDGETS = (
    "run_name", "micro_batch_size", "grad_accum_steps", "gradient_checkpointing", "blocks_to_swap", "seed",
    "timestep_sampling", "logit_mean", "logit_std", "resolution_shift", "caption_dropout", "checkpoint_every",
    "max_nonfinite_steps",
)
# The seed widget is called training_seed: ComfyUI gives any INT input named "seed" a "randomize after
# queue" control, which would change the seed, hence start a new run, on every queue.
WIDGET_NAMES = {"seed": "training_seed"}
AUTO_SWAP = -1


def run_directory(run_name: str) -> Path:
    """Where a run's checkpoints live: inside ComfyUI's output folder, one folder per run name."""
    return host.output_directory() / "qwen_lora_training" / "runs" / check_run_name(run_name)


def trainer_signature(models, cached, lora_cfg, optim_cfg, train_cfg, init_lora=None) -> str:
    """What a live trainer was built from; the same inputs continue it instead of starting over."""
    parts = {
        "init_lora": str(init_lora),
        "models": id(models.transformer),
        "samples": [(s.latent_key, s.text_key) for s in cached.samples],
        "repeats": cached.repeats,
        "lora": to_dict(lora_cfg), "optimizer": to_dict(optim_cfg), "train": to_dict(train_cfg),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class QwenLoRAInitTrainer:
    DESCRIPTION = (
        "Creates the trainer (LoRA on the transformer, optimizer, schedule, data order) or, when a trainer of "
        "this run name built from the same inputs is alive, hands that one on so training continues."
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
        }}

    def init(self, models, cached_dataset, lora_config, optimizer_config, continue_from_lora=NO_LORA, **widget_values):
        names = {widget: field for field, widget in WIDGET_NAMES.items()}
        train_cfg = TrainConfig(**{names.get(k, k): v for k, v in widget_values.items()})
        train_cfg.validate(num_blocks=models.num_blocks)
        init_lora = None if continue_from_lora == NO_LORA else host.model_file_path("loras", continue_from_lora)
        signature = trainer_signature(models, cached_dataset, lora_config, optimizer_config, train_cfg, init_lora)
        live = registry.find(train_cfg.run_name, signature)
        if live is not None:
            return (live, f"continuing run '{train_cfg.run_name}' at step {live.step} (still in memory)")
        # One adapter per model at a time: finish (checkpoint) and detach whatever trains this model now.
        retiring = registry.retire_users_of(models.transformer)
        stale = registry.retire(train_cfg.run_name)
        for old in retiring + ([stale] if stale is not None and stale not in retiring else []):
            with engine_mode():
                old.checkpoint_if_behind()
            old.close()
        host.free_host_models()  # before the Trainer plans 'auto' swapping against the free memory
        run_dir = run_directory(train_cfg.run_name)
        with engine_mode():
            trainer = Trainer(models, cached_dataset, lora_config, optimizer_config, train_cfg, run_dir=run_dir,
                              init_lora=init_lora)
            try:
                resumed = trainer.resume()
            except BaseException:
                trainer.close()  # leave the model without a half-made adapter
                raise
        log.info("[qwen-lora] memory plan for run '%s':\n%s", train_cfg.run_name, trainer.memory_plan)
        registry.register(train_cfg.run_name, trainer, signature)
        if resumed:
            status = f"resumed run '{train_cfg.run_name}' from its checkpoint at step {trainer.step} ({run_dir})"
        else:
            status = f"started run '{train_cfg.run_name}' at step 0; checkpoints go to {run_dir}"
        log.info("[qwen-lora] %s", status)
        return (trainer, f"{status}\nblocks_to_swap: {trainer.train_cfg.blocks_to_swap}\n\n{trainer.memory_plan}")


class QwenLoRATrain:
    DESCRIPTION = (
        "Trains the LoRA for N more steps. Runs on every queue: queue again to continue where it stopped. "
        "Cancel stops at the next step boundary with everything trained so far kept."
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
            **widgets(TrainStepsConfig, "steps"),
        }}

    @classmethod
    def IS_CHANGED(cls, **_):
        return float("nan")  # never equal to itself: the node runs on every queue

    def train(self, trainer: Trainer, steps: int):
        progress = host.Progress(steps)
        first = trainer.step
        preview_every = max(1, steps // 20)
        last_log = [time.monotonic()]

        def on_step(report):
            done = report.step - first
            preview = loss_plot(trainer.loss_history, 512, 256, title=trainer.train_cfg.run_name) \
                if done % preview_every == 0 or done == steps else None
            if time.monotonic() - last_log[0] > 10 or done == steps:
                log.info("[qwen-lora] %s step %d (%d/%d) loss %.4f lr %.2e %.2fs/step", trainer.train_cfg.run_name,
                         report.step, done, steps, report.loss, report.lr, report.seconds)
                last_log[0] = time.monotonic()
            progress.update(done, preview)  # raises ComfyUI's interrupt at this step boundary

        with engine_mode():
            report = trainer.train(steps, on_step=on_step)
        text = (f"steps {report.first_step}-{report.last_step}: mean loss {report.mean_loss:.4f}, "
                f"last {trainer.last_loss():.4f}, {report.seconds / max(1, report.steps):.2f} s/step")
        return (trainer, report.mean_loss, text)
