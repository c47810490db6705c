"""The toy family's dataset convention: a folder of images and one `captions.json` naming each image's caption."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

from trainer_core.core.config import DatasetConfig
from trainer_core.core.errors import UserInputError
from trainer_core.data.images import Dataset, Sample, discover, split_validation

CAPTION_TABLE = "caption-table"  # `Sample.kind` of this convention


@dataclass(frozen=True)
class TableSample(Sample):
    kind: ClassVar[str] = CAPTION_TABLE


def load_caption_table_dataset(cfg: DatasetConfig) -> Dataset:
    """The images of `cfg.folder`, each captioned by the folder's captions.json (an image it does not name: refused)."""
    table_path = Path(cfg.folder) / "captions.json"
    if not table_path.is_file():
        raise UserInputError(f"{cfg.folder} has no captions.json: the toy family reads its captions from it.")
    table = json.loads(table_path.read_text())
    found = discover(DatasetConfig(**{**vars(cfg), "missing_caption": "empty"}))
    missing = [Path(s.image_path).name for s in found if Path(s.image_path).name not in table]
    if missing:
        raise UserInputError(f"captions.json names no caption for {missing[0]}: add it.")
    samples = [TableSample(**{f.name: getattr(s, f.name) for f in fields(s)} | {"caption": table[Path(s.image_path).name]})
               for s in found]
    return Dataset(cfg, *split_validation(samples, cfg))
