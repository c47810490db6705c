"""Captions written into a dataset folder: which images need one, and writing them so that nothing is lost.

The images are the folder's own training images as the Dataset nodes find them (data/images.py's extensions, hidden
files left out), less what is not a training target: loss masks (`name_mask.png` without a caption of its own; the
`masks/` subfolder is not looked in) and an edit dataset's control images (`name_control.png`, `name_control_2.png`;
its `control/` subfolder is not looked in). An image with a caption keeps it unless `overwrite` is on; then its old
caption is first copied to `name.txt.bak` (`name.txt.bak2`, `.bak3`, ... when that exists: a backup is never
overwritten either), so a caption a person wrote is always on disk somewhere. Every file is written atomically
(core/files.py): an interrupt or a full disk leaves the old caption or the new one, never half of one; what a
killed run leaves behind (`.name.txt.PID.tmp`, its process gone) the next run clears, and nothing else.

Before the model loads, the folder is checked: two images of one name (`a.png`, `a.jpg`: one `a.txt` would caption
both) are refused by name, and so is a folder the captions cannot be written into (read-only, no permission).

With the `edit` style the folder is an Edit Dataset's (data/edit_dataset.py's convention): each target is shown to the
model after its control images (name_control.png, name_control_2.png, ... or control/name.png), and its caption is
the edit instruction; a target without a control is refused by name before the model loads.

Images are captioned one at a time, in file-name order; `stop()` is asked before each (the node's raises ComfyUI's
interrupt, the CLI's Ctrl+C raises KeyboardInterrupt): what was written stays. `progress(done, total, result)` after
each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..core.command_config import GREEDY
from ..core.config import CaptionConfig, DatasetConfig
from ..core.errors import UserInputError
from ..core.files import remove_leftovers, temp_path, write_bytes_atomic, write_error
from ..data.edit_dataset import find_controls, is_control_file
from ..data.images import IMAGE_EXTENSIONS, decode_caption, open_image, read_file
from ..data.masks import is_mask_name
from .generate import Decoding, answers
from .prompts import EDIT, finish_caption, instruction_text, max_new_tokens

CAPTION_SUFFIX = ".txt"
BACKUP_SUFFIX = ".bak"

# What became of one image (CaptionResult.status).
WRITTEN, REPLACED, KEPT, EMPTY = "written", "replaced", "kept", "empty"


@dataclass(frozen=True)
class CaptionResult:
    image: Path
    status: str  # WRITTEN (it had none), REPLACED (overwrite; `backup` holds the old one), KEPT, EMPTY (nothing usable)
    caption: str  # the caption on disk now (KEPT: the existing one)
    backup: Path | None = None


@dataclass
class CaptionReport:
    folder: Path
    results: list[CaptionResult] = field(default_factory=list)
    total: int = 0  # images in the folder
    stopped: bool = False  # stopped between images; the rest were not captioned

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    def summary(self) -> str:
        parts = [f"{self.count(WRITTEN)} written", f"{self.count(REPLACED)} replaced (old captions kept as .bak)",
                 f"{self.count(KEPT)} kept"]
        if self.count(EMPTY):
            parts.append(f"{self.count(EMPTY)} left without a caption (the model wrote nothing usable)")
        stopped = f"; stopped after {len(self.results) - self.count(KEPT)} images" if self.stopped else ""
        return f"{self.total} images in {self.folder}: " + ", ".join(parts) + stopped + "."


def caption_path(image: Path) -> Path:
    return image.with_suffix(CAPTION_SUFFIX)


def dataset_images(folder: str | Path) -> list[Path]:
    """The training images of `folder` in file-name order (module docstring: masks and control images left out)."""
    if not str(folder).strip():
        raise UserInputError("folder is empty: enter the dataset folder whose images should get captions.")
    root = Path(folder).expanduser().absolute()
    if not root.is_dir():
        raise UserInputError(f"dataset folder {root} does not exist: enter the folder whose images should get "
                             "captions.")
    settings = DatasetConfig(folder=str(root))
    try:
        entries = sorted(root.iterdir())
    except OSError as e:
        raise UserInputError(f"dataset folder {root} cannot be listed ({e.strerror or e}): let this user read "
                             "it.") from None
    images = [p for p in entries if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".") and p.is_file()]
    targets = [p for p in images if not is_mask_name(p, settings)
               and not (is_control_file(p) and not caption_path(p).exists())]
    if not targets:
        raise UserInputError(f"dataset folder {root} has no images to caption ({', '.join(IMAGE_EXTENSIONS)}; mask and "
                             "control images are not captioned): add the training images.")
    check_one_image_per_name(root, targets)
    return targets


def check_one_image_per_name(root: Path, images: list[Path]) -> None:
    """Refuse two images whose captions would be one file (`a.png` and `a.jpg` -> `a.txt`; `a.png` and `A.jpg` too,
    which are one caption on Windows' and macOS' disks): one caption would describe the other picture."""
    by_name: dict[str, list[Path]] = {}
    for image in images:
        by_name.setdefault(caption_path(image).name.casefold(), []).append(image)
    shared = [names for names in by_name.values() if len(names) > 1]
    if shared:
        pairs = "; ".join(" and ".join(p.name for p in names) + f" -> {caption_path(names[0]).name}" for names in shared)
        other = shared[0][-1]
        raise UserInputError(
            f"dataset folder {root} has images that share one caption file ({pairs}): one caption cannot describe "
            f"both pictures. Rename all but one of each (e.g. {other.name} -> {other.stem}_2{other.suffix}) and run "
            "again; nothing was written.")


# What this module's writes leave when the process is killed: `.NAME.PID.tmp` for NAME a caption or its backup.
CAPTION_LEFTOVER = r".+\.txt(\.bak[0-9]*)?"


def check_writable(folder: Path, images: list[Path]) -> None:
    """Refuse, before the model loads, a folder the captions cannot be written into: a temporary file named as the
    first caption's would be (core/files.temp_path) is made and removed; its error names the folder and the fix."""
    for image in images:  # (an existing caption is read and backed up, then replaced: a folder cannot be)
        if caption_path(image).is_dir():
            raise UserInputError(f"{caption_path(image)} is a folder where {image.name}'s caption file goes: rename or "
                                 "move it, and run again. No caption was written and the model was not loaded.")
    probe = temp_path(caption_path(images[0]))
    try:
        with open(probe, "wb"):  # (this process' own temporary name: nobody else writes it)
            pass
        probe.unlink()
    except OSError as e:
        raise write_error(e, "captions", folder, "No caption was written and the model was not loaded.") from None


def needs_caption(image: Path, overwrite: bool) -> bool:
    return overwrite or not (caption_path(image).exists() or caption_path(image).is_symlink())


def backup_path(caption: Path) -> Path:
    """The first free `name.txt.bak`, `name.txt.bak2`, ... beside `caption`."""
    candidate, n = caption.with_name(caption.name + BACKUP_SUFFIX), 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = caption.with_name(f"{caption.name}{BACKUP_SUFFIX}{n}")
    return candidate


def write_caption(image: Path, text: str) -> tuple[str, Path | None]:
    """Write `text` as `image`'s caption, an existing one backed up first: (status, the backup or None)."""
    target = caption_path(image)
    backup = None
    if target.exists():
        backup = write_bytes_atomic(read_file(target, "caption", "a text file"), backup_path(target))
    write_bytes_atomic(text.encode("utf-8"), target)
    return (REPLACED if backup is not None else WRITTEN), backup


def existing_caption(image: Path) -> str:
    """The caption kept, for the report (one the Dataset node could not read says so there, not here)."""
    target = caption_path(image)
    try:
        return decode_caption(read_file(target, "caption", "a text file"), target)
    except UserInputError as e:
        return f"(kept, but not readable as text: {e})"


def shown_with(settings: CaptionConfig, images: list[Path]) -> dict[Path, list[Path]]:
    """Each image -> the images the model sees before it: its control images with the `edit` style, else none."""
    if settings.style != EDIT:
        return {image: [] for image in images}
    try:  # (the Edit Dataset's own convention: a target without a control is refused there, by name)
        return find_controls(Path(settings.folder).expanduser().absolute(), images)
    except UserInputError as e:
        raise UserInputError(f"{e} The 'edit' style captions an Edit Dataset: each target after its controls; for a "
                             "folder of single images choose another style.") from None


def caption_folder(vlm, settings: CaptionConfig, stop: Callable[[], bool] | None = None,
                   progress: Callable[[int, int, CaptionResult], None] | None = None,
                   min_new_tokens: int = 0) -> CaptionReport:
    """Caption `settings.folder`'s images with `vlm` (a models.vision_language.VisionLanguageModel) as the module
    docstring says, `batch_size(...)` images per `generate` call. `min_new_tokens`: see generate.Decoding (tests of
    random tiny models). The report lists the images in file-name order; `progress` hears of each as it is done."""
    images = dataset_images(settings.folder)
    before = shown_with(settings, images)
    report = CaptionReport(folder=Path(settings.folder).expanduser().absolute(), total=len(images))
    remove_leftovers(report.folder, names=CAPTION_LEFTOVER)  # a killed run's (its process gone), never anyone else's
    instruction = instruction_text(settings)
    decoding = Decoding(max_new_tokens=max_new_tokens(settings), seed=settings.sampling_seed,
                        min_new_tokens=min_new_tokens)
    batch = batch_size(vlm, settings, decoding.max_new_tokens) if vlm is not None else 1
    pending: list[Path] = []

    def done(result: CaptionResult) -> None:
        report.results.append(result)
        if progress is not None:
            progress(len(report.results), len(images), result)

    def caption_pending() -> None:
        shown = [[*map(open_image, before[image]), open_image(image)] for image in pending]
        answered = answers(vlm, shown, instruction, decoding, max_pixels=settings.image_side ** 2)
        for image, (_ids, text) in zip(pending, answered):
            caption = finish_caption(text, settings)
            if caption:
                status, backup = write_caption(image, caption)
                done(CaptionResult(image, status, caption, backup))
            else:  # nothing written: the image still has no caption, the next run tries again
                done(CaptionResult(image, EMPTY, ""))
        pending.clear()

    for image in images:
        if stop is not None and stop():
            report.stopped = True  # (images gathered for a batch and not captioned yet stay without a caption)
            break
        if needs_caption(image, settings.overwrite):
            pending.append(image)
            if len(pending) == batch:
                caption_pending()
        else:
            done(CaptionResult(image, KEPT, existing_caption(image)))
    else:
        if pending:
            caption_pending()
    report.results.sort(key=lambda r: images.index(r.image))
    return report


def batch_size(vlm, settings: CaptionConfig, new_tokens: int) -> int:
    """Images per `generate` call: the setting's, else (0) as many as the memory plan's captioning phase fits in the
    GPU can still give now (`planner.device.room_now`; the model is resident: its weights count as room for the plan,
    which counts them); one on a
    CPU, for a model the plan does not know, and when a seed samples (each image's caption then depends on the seed
    alone, not on the images batched with it)."""
    if settings.batch_size:
        return settings.batch_size
    if vlm.device.type != "cuda" or vlm.planned_parts is None or settings.sampling_seed != GREEDY:
        return 1
    from ..planner.captioning import caption_batch_that_fits, weights_bytes
    from ..planner.device import detect_budget
    from ..planner.plan import DTYPE_BYTES, PlanInputs

    dtype = str(next(vlm.model.parameters()).dtype).removeprefix("torch.")
    storage = "float8" if vlm.one_byte else "bfloat16"
    plan = PlanInputs(caption=True, device="cuda", compute_dtype=dtype, caption_storage=storage,
                      text_encoder_file_fp8=vlm.one_byte, caption_tokens=new_tokens, cuda_context_bytes=0,
                      caption_image=(settings.image_side, settings.image_side))
    resident = weights_bytes(vlm.planned_parts, storage, DTYPE_BYTES[dtype])
    # the resident model's weights are allocated and in the plan: given back to the room (`device.room_now`)
    return caption_batch_that_fits(plan, vlm.planned_parts, detect_budget(vlm.device, counted_bytes=resident).bytes)


def images_needing_captions(settings: CaptionConfig) -> list[Path]:
    """The images `caption_folder` would caption now (none: the model need not even be loaded)."""
    return [p for p in dataset_images(settings.folder) if needs_caption(p, settings.overwrite)]


def caption_dataset(settings: CaptionConfig, text_encoder: str | Path, tokenizer_dir: str | Path | None = None,
                    device="cpu", compute_dtype: str = "auto", stop: Callable[[], bool] | None = None,
                    progress: Callable[[int, int, CaptionResult], None] | None = None,
                    min_new_tokens: int = 0) -> CaptionReport:
    """`caption_folder` with the model of `text_encoder` loaded for it and freed after (model.vision_language_model);
    not loaded at all when every image keeps its caption."""
    from .model import vision_language_model

    images = dataset_images(settings.folder)  # two images of one name: refused before loading
    shown_with(settings, images)  # an edit target without its control: refused before loading
    pending = images_needing_captions(settings)
    if not pending:
        return caption_folder(None, settings, stop, progress)
    check_writable(Path(settings.folder).expanduser().absolute(), pending)
    side = settings.image_side
    with vision_language_model(text_encoder, tokenizer_dir, device, compute_dtype, settings.text_encoder_fp8,
                               (side, side), max_new_tokens(settings)) as vlm:
        return caption_folder(vlm, settings, stop, progress, min_new_tokens)

