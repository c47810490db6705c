"""Training: the recipe (recipe.Trainer, the loop) over components with one concern each (see recipe.py)."""

from .periodic import Every, StepExtras, every
from .recipe import Trainer
from .reports import StepReport, TrainReport
from .state import MUST_MATCH_LORA

__all__ = ["Every", "MUST_MATCH_LORA", "StepExtras", "StepReport", "TrainReport", "Trainer", "every"]
