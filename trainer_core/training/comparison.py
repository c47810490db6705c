"""Trainer builds that differ from the default in one respect, for measurements that compare costs.

Each one trains the same LoRA from the same batches as the default (up to float rounding) and only moves
the cost somewhere else: the benchmarks (benchmarks/gpu_speed_check.py) measure what an earlier design
choice saves by undoing it. They are a supported option of `Trainer` so that no script patches the
trainer's internals from outside; users never need them.
"""

from __future__ import annotations

from dataclasses import dataclass

PLACEMENTS = ("spread", "tail")
LORA_COMPUTES = ("compute dtype", "float32")


@dataclass(frozen=True)
class Comparison:
    # "spread": the streamed blocks spread over the depth (streaming.placement.default_placement); "tail": the last
    # blocks_to_swap blocks, the layout before the timeline model.
    placement: str = "spread"
    # False: every training forward copies its streamed blocks whole (no modulation outputs planned ahead).
    modulation_ahead: bool = True
    # "compute dtype": LoRA matmuls in the activations' dtype (lora.compute_in_input_dtype); "float32":
    # peft's own cast of the inputs up to the fp32 LoRA weights.
    lora_compute: str = "compute dtype"

    def __post_init__(self) -> None:
        self.validate()  # checked once, where it is made, as the settings are

    def validate(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"Comparison.placement {self.placement!r}: choose one of {', '.join(PLACEMENTS)}.")
        if self.lora_compute not in LORA_COMPUTES:
            raise ValueError(f"Comparison.lora_compute {self.lora_compute!r}: choose one of {', '.join(LORA_COMPUTES)}.")

    @property
    def label(self) -> str:
        parts = [f"{self.placement} placement"] if self.placement != "spread" else []
        parts += [] if self.modulation_ahead else ["no modulation ahead"]
        parts += [f"LoRA in {self.lora_compute}"] if self.lora_compute != "compute dtype" else []
        return ", ".join(parts) or "default"


DEFAULT = Comparison()
