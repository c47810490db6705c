"""Settings that cannot do what they say in a run's combination of settings and data.

Where the run would train nothing (every dataset weighs 0, or every dataset is a regularisation set: no subject),
the Trainer refuses before it builds anything (`check_trainable`). Where a setting merely changes nothing, the run
trains and Init Trainer's status (the `train` command's output) says so, naming the setting and what to do
(`idle_settings`): a setting that silently does nothing is a setting the user believes in. (A loss-mask weight
without masks is said by the dataset's summary, data/masks.masks_clause, where the masks are looked for.)
"""

from __future__ import annotations

from ..core.config import LoraConfig, OptimizerConfig, TrainConfig, field_default
from ..core.errors import UserInputError


def check_trainable(samples) -> None:
    """Refuse cached `samples` on which no step could teach the LoRA anything."""
    if all(s.loss_weight == 0 for s in samples):
        raise UserInputError(
            "every training image's dataset has loss_weight 0, so every step's loss would be 0 and the LoRA would not "
            "change: set loss_weight above 0 on the dataset the LoRA should learn (1 = as usual).")
    if not any(not s.regularization and s.loss_weight > 0 for s in samples):
        weightless = " or has loss_weight 0" if any(not s.regularization for s in samples) else ""
        raise UserInputError(
            f"every dataset is marked is_regularization{weightless}: a regularisation set keeps what the base model "
            "knows beside the images the LoRA learns, and this run has none of those. Turn is_regularization off on "
            "the subject's dataset and give it a loss_weight above 0 (or add it beside the regularisation set with a "
            "Dataset Mix).")


def unused_preservation(trigger: str, weight: float) -> str | None:
    """The sentence for preservation captions asked for while preservation is off, or None."""
    if not trigger.strip() or weight > 0:
        return None
    return (f"preservation_trigger {trigger.strip()!r} is set, but preservation_weight is 0, so differential output "
            "preservation is off and its class captions are not used: set preservation_weight (Init Trainer, try 1.0) "
            "to use them, or clear preservation_trigger.")


def idle_settings(dataset, lora: LoraConfig, optimizer: OptimizerConfig, train: TrainConfig) -> list[str]:
    """One sentence per setting that changes nothing in this run, each naming it and what to do."""
    notes = []

    def changed(cfg, *names: str) -> list[str]:
        return [f"{n}={getattr(cfg, n)!r}" for n in names if getattr(cfg, n) != field_default(type(cfg), n)]

    if any(s.preservation_text_key for s in dataset.samples) and train.preservation_weight == 0:
        notes.append("the cache holds preservation's class captions (the Cache node's preservation_trigger and "
                     "preservation_class), but preservation_weight is 0, so they are not used: set preservation_weight "
                     "(try 1.0), or clear preservation_trigger so that caching skips them.")
    if train.validation_every and not dataset.validation:
        notes.append(f"validation_every={train.validation_every}, but the dataset holds no validation images, so no "
                     "validation loss is measured: set the Dataset node's validation_images (a run file's [dataset] "
                     "validation_images) to 1 or more, or validation_every to 0.")
    if dataset.validation and not train.validation_every:
        notes.append(f"{len(dataset.validation)} images are held out for validation (validation_images), but "
                     "validation_every is 0, so they are neither trained on nor measured: set validation_every to "
                     "measure them, or validation_images to 0 to train on them.")
    if train.timestep_sampling == "uniform" and (unused := changed(train, "logit_mean", "logit_std")):
        notes.append(f"{', '.join(unused)} change nothing with timestep_sampling 'uniform' (they shape the "
                     "logit-normal draw): choose logit_normal, or leave them at their defaults.")
    if not optimizer.ema and (unused := changed(optimizer, "ema_decay")):
        notes.append(f"{unused[0]} changes nothing with ema off: turn ema on, or leave ema_decay at its default.")
    if lora.adapter != "lokr" and (unused := changed(lora, "lokr_factor", "lokr_decompose_both")):
        notes.append(f"{', '.join(unused)} change nothing with adapter {lora.adapter!r} (they shape LoKr's factors): "
                     "choose adapter lokr, or leave them at their defaults.")
    return notes
