"""A run's live previews on disk, beside its checkpoints, so a resumed run keeps its history and its "before".

A trainer keeps its previews in memory (`Trainer.step_previews`, small copies) and measures each new one against the
untrained model's (`live.PreviewMovement`). A trainer built again from a checkpoint (ComfyUI restarted, another
workflow's run took the model, Release) would start both afresh: Compare Steps without step 0, and the movement from
the untrained picture unknown. So every preview is also written into the run folder:

    <run_dir>/kept_previews/step_000050.png   the small copy Compare Steps shows (live.KEPT_PREVIEW_SIDE a side)
    <run_dir>/kept_previews/untrained.png     step 0 (the model before the LoRA) at full size: movement's start
    <run_dir>/kept_previews/newest.png        the newest preview at full size: the "one before" of the next
    <run_dir>/kept_previews/previews.json     {"settings": the preview settings, "newest": its step}

and read back when a resumed trainer's first preview is due (`restore`). Previews of another prompt, size or seed
compare with nothing: they are not restored, and the caller says why. A run started again at step 0 (no checkpoint
left) clears the folder when its untrained preview is written.
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
from pathlib import Path

from PIL import Image

from ..core.files import write_bytes_atomic
from .live import PreviewSettings, StepPreview

FOLDER = "kept_previews"  # (a run file's own preview files go to previews/)
UNTRAINED, NEWEST, INDEX = "untrained.png", "newest.png", "previews.json"


def folder(run_dir: str | Path) -> Path:
    return Path(run_dir) / FOLDER


def settings_record(settings: PreviewSettings | None) -> dict:
    """What makes previews comparable (None: the host's own previews, e.g. a run file's)."""
    return dataclasses.asdict(settings) if settings is not None else {"host": "own previews"}


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def save(run_dir: str | Path, preview: StepPreview, small: StepPreview | None,
         settings: PreviewSettings | None) -> None:
    """Write `preview` (full size) and its kept small copy `small` into the run folder (the module docstring)."""
    where = folder(run_dir)
    if preview.step == 0 and where.is_dir():
        shutil.rmtree(where)  # a run started again from step 0: the earlier run's previews are not this one's
    where.mkdir(parents=True, exist_ok=True)
    if small is not None:
        write_bytes_atomic(_png(small.image), where / f"step_{preview.step:06d}.png")
    if preview.step == 0:
        write_bytes_atomic(_png(preview.image), where / UNTRAINED)
    write_bytes_atomic(_png(preview.image), where / NEWEST)
    index = {"settings": settings_record(settings), "newest": preview.step}
    write_bytes_atomic(json.dumps(index).encode(), where / INDEX)


@dataclasses.dataclass
class Restored:
    """What `restore` found: the small copies up to the resumed step, the untrained and the newest picture at full
    size (None where missing), or `note`: why nothing was restored, for a person."""

    kept: list[StepPreview] = dataclasses.field(default_factory=list)
    untrained: Image.Image | None = None
    previous: Image.Image | None = None
    note: str = ""


def _open(path: Path) -> Image.Image:
    with Image.open(path) as image:
        image.load()
        return image.copy()


def restore(run_dir: str | Path, settings: PreviewSettings | None, step: int) -> Restored:
    """The run's previews of steps up to `step` (a resumed checkpoint's) made with `settings`."""
    where = folder(run_dir)
    try:
        index = json.loads((where / INDEX).read_text())
    except (OSError, ValueError):
        return Restored(note=f"no previews of this run before step {step} are on disk ({where}): previews were off "
                             "then, or the run folder was made before they were kept")
    if index.get("settings") != settings_record(settings):
        return Restored(note=f"the previews before step {step} were made with other preview settings "
                             f"({index.get('settings')}), so they compare with nothing now")
    kept = []
    for path in sorted(where.glob("step_*.png")):
        made_at = int(path.stem.split("_")[1])
        if made_at <= step:  # a killed run's previews after its last checkpoint were of steps now undone
            kept.append(StepPreview(made_at, _open(path), 0.0))
    untrained = _open(where / UNTRAINED) if (where / UNTRAINED).is_file() else None
    newest = index.get("newest")
    previous = _open(where / NEWEST) if (where / NEWEST).is_file() and isinstance(newest, int) and newest <= step \
        else None
    note = "" if untrained is not None else (f"this run's untrained preview is not on disk ({where / UNTRAINED}): "
                                             "previews were off at step 0")
    return Restored(kept, untrained, previous, note)
