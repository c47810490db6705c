"""An edit dataset: per sample a target image, its caption (the edit instruction) and 1 to 10 control images.

A convention two families train on: Qwen-Image-Edit (the controls it edits) and Qwen-Image 2.1 (its reference
images); each family decides how its controls are sized and encoded, and how many it takes: Qwen-Image 2.1 up to ten
references, Qwen-Image-Edit-2509 and 2511 three controls, Edit one (refused by name when the dataset is cached).

Folder convention (either form; one per sample, never both):

    name.png + name.txt                     target and caption, as for text-to-image
    name_control.png                        control image 1 in the same folder   (or name_control_1.png)
    name_control_2.png ... _control_10.png  controls 2 to 10 (Edit-2509 / Edit-2511: up to 3; 2.1: up to 10)
  or
    control/name.png                        control image 1 in a `control` subfolder
    control/name_2.png ... control/name_10.png  controls 2 to 10

Any image extension works for a control. The target decides the bucket (as in text-to-image); each control
keeps its own aspect ratio and is sized by the edit model's rule when cached (pipelines.py), as the
pipelines do at inference. Errors name the file: a target without a control, a control without a target,
a control number beyond 10 or after a gap, both forms for one target.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..core.config import DatasetConfig, EditDataConfig
from ..core.errors import UserInputError
from .images import IMAGE_EXTENSIONS, Dataset, Sample, decode_image, discover, read_file, split_validation

EDIT = "edit"  # an edit dataset (the Edit Dataset node's): `Sample.kind`
MAX_CONTROLS = 10  # Qwen-Image 2.1's references (its pipeline takes ten); each family refuses more than it takes
CONTROL_FOLDER = "control"
_SAME_FOLDER = re.compile(r"^(?P<stem>.+)_control(?:_(?P<n>\d+))?$")  # name_control, name_control_2
_SUBFOLDER = re.compile(r"^(?P<stem>.+?)(?:_(?P<n>\d+))?$")  # control/name, control/name_2


@dataclass(frozen=True)
class ControlImage:
    path: str
    sha256: str
    width: int  # after EXIF rotation
    height: int
    decode: str = ""  # as Sample.decode: how its pixels depend on decoding settings


@dataclass(frozen=True)
class EditSample(Sample):
    """A target `Sample` with its control images, in order (Picture 1, 2, ...)."""

    kind: ClassVar[str] = EDIT
    controls: tuple[ControlImage, ...] = ()


def is_control_file(path: Path) -> bool:
    return bool(_SAME_FOLDER.match(path.stem)) and path.suffix.lower() in IMAGE_EXTENSIONS


def _images(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith("."))


def _numbered(paths: list[Path], pattern: re.Pattern, where: str, targets: set[str] = frozenset()
              ) -> dict[str, dict[int, Path]]:
    """stem -> {control number: path}; a bad number is refused by name. A name that is a target's whole name
    is that target's control 1 (`control/photo_2.png` for the target `photo_2.png`)."""
    found: dict[str, dict[int, Path]] = {}
    for path in paths:
        match = pattern.match(path.stem)
        stem, n = (path.stem, 1) if path.stem in targets else (match["stem"], int(match["n"]) if match["n"] else 1)
        if n < 1 or n > MAX_CONTROLS:
            raise UserInputError(f"control image {path} has number {n}: an edit sample takes controls 1 to "
                                 f"{MAX_CONTROLS} ({where}). Rename or remove it.")
        slot = found.setdefault(stem, {})
        if n in slot:
            raise UserInputError(f"control images {slot[n]} and {path} are both control {n} of '{stem}': keep "
                                 "one of them (one file per number, whatever its extension).")
        slot[n] = path
    return found


def find_controls(folder: Path, targets: list[Path]) -> dict[Path, list[Path]]:
    """target path -> its control paths in order, by the folder convention (module docstring)."""
    by_stem = {t.stem: t for t in targets}
    same = _numbered([p for p in _images(folder) if is_control_file(p) and p.stem not in by_stem],  # (a target
                     _SAME_FOLDER, f"{folder}/<name>_control_N")  # named x_control, with its caption, stays a target)
    sub_folder = folder / CONTROL_FOLDER
    sub = _numbered(_images(sub_folder), _SUBFOLDER, f"{sub_folder}/<name>_N", set(by_stem))
    for stem, controls in [*same.items(), *sub.items()]:
        if stem not in by_stem:
            extra = sorted(controls.values())[0]
            raise UserInputError(
                f"control image {extra} belongs to no training image: {folder} has no image named '{stem}' (with "
                f"its caption). Add the target image {stem}.png or remove the control.")
    result: dict[Path, list[Path]] = {}
    for target in targets:
        a, b = same.get(target.stem, {}), sub.get(target.stem, {})
        if a and b:
            raise UserInputError(
                f"image {target.name} has controls both beside it ({sorted(a.values())[0].name}) and in {sub_folder} "
                f"({sorted(b.values())[0].name}): use one form per sample.")
        numbered = a or b
        if not numbered:
            raise UserInputError(
                f"image {target.name} has no control image: add {target.stem}_control.png beside it (or "
                f"{CONTROL_FOLDER}/{target.stem}.png); every edit sample needs 1 to {MAX_CONTROLS} controls."
                + "".join(f" ({t.name} has its own caption, so it is a training image: remove its caption to make it "
                          f"{target.name}'s control.)" for t in targets if t.stem == f"{target.stem}_control"))
        missing = [n for n in range(1, max(numbered) + 1) if n not in numbered]
        if missing:
            raise UserInputError(
                f"image {target.name} has control {max(numbered)} but not control {missing[0]}: number its controls "
                f"1, 2, 3 without gaps ({target.stem}_control.png, {target.stem}_control_2.png, ...).")
        result[target] = [numbered[n] for n in sorted(numbered)]
    return result


def read_control(path: Path, background, allow_large_images: bool) -> ControlImage:
    data = read_file(path, "control image")
    image, decode = decode_image(data, path, background, allow_large_images)
    return ControlImage(path=str(path), sha256=hashlib.sha256(data).hexdigest(), width=image.width,
                        height=image.height, decode=decode)


def discover_edit(cfg: DatasetConfig) -> list[EditSample]:
    """Every target with caption, bucket and controls, sorted by file name (errors name the file)."""
    # A name_control image with its own caption is a training image that happens to be named so, not a control.
    targets = discover(cfg, exclude=lambda p: is_control_file(p) and not p.with_suffix(cfg.caption_extension).exists())
    folder = Path(cfg.folder).expanduser().absolute()
    controls = find_controls(folder, [Path(s.image_path) for s in targets])
    samples = []
    for target in targets:
        found = controls[Path(target.image_path)]
        samples.append(EditSample(**{f.name: getattr(target, f.name) for f in dataclasses.fields(target)},
                                  controls=tuple(read_control(p, target.background, target.allow_large_images)
                                                 for p in found)))
    return samples


def load_edit_dataset(cfg: DatasetConfig, edit: EditDataConfig | None = None) -> "EditDataset":
    """The edit samples, with `validation_images` of them held out as for text-to-image."""
    edit = edit or EditDataConfig()
    edit.validate()
    samples = discover_edit(cfg)
    training, validation = split_validation(samples, cfg)
    return EditDataset(config=cfg, samples=training, validation=validation, edit=edit)


@dataclass(frozen=True)
class EditDataset(Dataset):
    edit: EditDataConfig = None

    def summary(self) -> str:
        counts: dict[int, int] = {}
        for s in self.samples:
            counts[len(s.controls)] = counts.get(len(s.controls), 0) + 1
        controls = ", ".join(f"{n} with {k} control{'s' if k > 1 else ''}" for k, n in sorted(counts.items()))
        size = self.edit.control_resolution or "the model's rule"
        return f"{super().summary()}; edit samples: {controls}; controls sized by {size}"

