"""Training images and captions: discovery, aspect-ratio buckets, resize and centre crop (decoding a file's pixels:
decoding.py).

Buckets have sides that are multiples of 32 px (so both the real VAE's 16 px and the tiny one's 8 px
token grid divide them, and the token grid is always even: ComfyUI centres RoPE positions one place off
from diffusers on odd grids). Each bucket holds about `resolution`^2 pixels.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from PIL import Image

from ..core.config import DatasetConfig, parse_colour
from ..core.errors import UserInputError
from .buckets import BUCKET_STEP, bucket_sizes, choose_bucket  # noqa: F401 (re-exported)
from .decoding import IMAGE_FORMATS, WHITE, decode_image, to_rgb  # noqa: F401 (re-exported, as below)
from .pixels import pil_to_tensor, tensor_to_pil  # noqa: F401 (re-exported: the data's users import them here)

if TYPE_CHECKING:
    import torch

    from .masks import SampleMask

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp")

IMAGES = "images"  # a dataset of images and captions (the Dataset node's): `Sample.kind`


@dataclass(frozen=True)
class Sample:
    """One training image as found on disk (before encoding)."""

    kind: ClassVar[str] = IMAGES  # the dataset convention that found it (a family's `dataset_kinds` lists its own)
    image_path: str
    caption: str
    width: int  # original size, after EXIF rotation
    height: int
    bucket: tuple[int, int]  # (width, height) it is cropped to
    image_sha256: str
    # How its pixels depend on settings or on a decoding that changed: "" for an opaque 8-bit image;
    # otherwise part of its cache key (a transparent image on another background is another latent).
    decode: str = ""
    background: tuple[int, int, int] = WHITE  # what transparent pixels are composited onto
    allow_large_images: bool = False
    # DatasetConfig.transparency: "keep" or "auto" let a family whose VAE encodes alpha keep a transparent image's
    # alpha (`keeps_alpha`); otherwise it is composited onto `background`
    transparency: str = "auto"
    mask: SampleMask | None = None  # its loss mask (masks.py), or None: trained everywhere
    # The dataset it came from (prior preservation's regularisation sets, the loss report per dataset).
    dataset: str = ""  # its label: the folder's name (runs/headless.py makes labels of several datasets distinct)
    loss_weight: float = 1.0  # DatasetConfig.loss_weight
    regularization: bool = False  # DatasetConfig.is_regularization


@dataclass(frozen=True)
class Dataset:
    """A discovered dataset: its settings, its training samples and the samples held out for validation."""

    config: DatasetConfig
    samples: tuple[Sample, ...]
    validation: tuple[Sample, ...] = ()

    def summary(self) -> str:
        buckets: dict[tuple[int, int], int] = {}
        for s in self.samples:
            buckets[s.bucket] = buckets.get(s.bucket, 0) + 1
        listing = ", ".join(f"{w}x{h}: {n}" for (w, h), n in sorted(buckets.items()))
        transparent = sum(1 for s in self.samples if s.decode.startswith("alpha"))
        held_out = (f"; {len(self.validation)} held out for validation: "
                    + ", ".join(Path(s.image_path).name for s in self.validation)) if self.validation else ""
        from .masks import masks_clause  # (masks.py reads images with this module's functions)
        masks = masks_clause(self.samples, self.config)
        return (f"{len(self.samples)} images x {self.config.repeats} repeats; buckets {listing}; "
                f"{transparent} with transparency {transparency_clause(self.config)}{masks}{held_out}")


def transparency_clause(cfg: DatasetConfig) -> str:
    """What becomes of transparent images under `cfg.transparency` (the dataset does not know the model yet)."""
    onto = f"composited onto {cfg.background.strip()}"
    if cfg.transparency == "flatten":
        return onto
    if cfg.transparency == "keep":
        return "kept (Qwen-Image 2.1 learns it; the other models refuse it)"
    return f"kept by Qwen-Image 2.1, {onto} for the other models"


def folder_state(folder: str | Path) -> str:
    """A cheap token that changes when any file in `folder` is added, removed or modified."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return "missing"
    h = hashlib.sha256()
    try:
        for p in sorted(folder.iterdir()):
            if p.is_file():
                st = p.stat()
                h.update(f"{p.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    except OSError as e:  # the Dataset node itself names the problem
        return f"unreadable: {e}"
    return h.hexdigest()


def load_dataset(cfg: DatasetConfig) -> Dataset:
    return Dataset(cfg, *split_validation(discover(cfg), cfg))


def split_validation(samples: list, cfg: DatasetConfig) -> tuple[tuple, tuple]:
    """(training samples, validation samples): `cfg.validation_images` held out (`validation_indices`), at least one
    left to train on; every dataset convention holds out the same way."""
    held = validation_indices(len(samples), cfg.validation_images)
    if cfg.validation_images and len(held) >= len(samples):
        raise UserInputError(
            f"validation_images={cfg.validation_images} holds out every one of the {len(samples)} images in "
            f"{cfg.folder}: keep at least one for training (lower validation_images or add images).")
    return tuple(s for i, s in enumerate(samples) if i not in held), tuple(samples[i] for i in sorted(held))


def validation_indices(count: int, held_out: int) -> set[int]:
    """Which of `count` images (in file-name order) are held out: `held_out` of them spread evenly, the
    middle of each of `held_out` equal stretches. Deterministic, independent of the seed, and spread over
    the folder rather than its last files (often the newest shots of one session)."""
    held_out = min(held_out, count)
    return {int((i + 0.5) * count / held_out) for i in range(held_out)}


def read_caption(image_path: Path, cfg: DatasetConfig) -> str:
    caption_path = image_path.with_suffix(cfg.caption_extension)
    if not caption_path.exists() and not caption_path.is_symlink():
        if cfg.missing_caption == "empty":
            return ""
        raise UserInputError(
            f"image {image_path.name} has no caption file {caption_path.name} in {image_path.parent}. "
            "Add the caption, or set missing_caption to 'empty' to train it without one."
        )
    return decode_caption(read_file(caption_path, "caption", "a text file"), caption_path)


# Byte order marks of the Unicode encodings a caption may come in (Windows Notepad's "Unicode" is UTF-16).
_BOMS = ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"), (b"\xff\xfe", "utf-16"),
         (b"\xfe\xff", "utf-16"))


def decode_caption(data: bytes, caption_path: Path) -> str:
    """UTF-8 (with or without its BOM), or UTF-16/UTF-32 when a byte order mark says so."""
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), "utf-8-sig")
    try:
        return data.decode(encoding).strip()
    except UnicodeDecodeError as e:
        raise UserInputError(
            f"caption {caption_path} is not {'UTF-8' if encoding == 'utf-8-sig' else encoding.upper()} text "
            f"(byte {e.start}). Re-save it as UTF-8."
        ) from None


def read_file(path: Path, kind: str = "image", thing: str = "an image file") -> bytes:
    """The bytes of a dataset file; a folder, a broken link, a pipe or a file this user may not read is an
    error naming the path and the fix."""
    if path.is_symlink() and not path.exists():
        raise UserInputError(
            f"{kind} {path} is a link to {os.readlink(path)}, which does not exist (or loops). Fix the link or "
            "remove it from the dataset folder."
        )
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise UserInputError(
                f"{kind} {path} is a folder, not {thing}: rename it (without the {path.suffix} extension) or move "
                "it out of the dataset folder."
            )
        if not stat.S_ISREG(mode):
            raise UserInputError(
                f"{kind} {path} is not a regular file (a pipe, socket or device): replace it with {thing} or "
                "remove it from the dataset folder."
            )
        return path.read_bytes()
    except PermissionError:
        raise UserInputError(
            f"{kind} {path} cannot be read: permission denied. Let the user that runs ComfyUI read it (for "
            f"example: chmod a+r '{path}'), or remove it from the dataset folder."
        ) from None
    except OSError as e:
        raise UserInputError(
            f"{kind} {path} cannot be read ({e.strerror or e}). Check the disk, copy the file again, or remove it "
            "from the dataset folder."
        ) from None


def decode_options(cfg: DatasetConfig) -> dict:
    """The settings that change how an image decodes, as `load_cropped`/`decode_image` take them."""
    return {"background": parse_colour(cfg.background), "allow_large_images": cfg.allow_large_images}


def open_image(path: Path, background: tuple[int, int, int] = WHITE, allow_large_images: bool = False,
               keep_alpha: bool = False) -> Image.Image:
    """Read and decode one image file to RGB, or RGBA when `keep_alpha` and it has transparency (see
    `decode_image`); errors name the file."""
    return decode_image(read_file(path), path, background, allow_large_images, keep_alpha)[0]


def dataset_fields(cfg: DatasetConfig) -> dict:
    """What a sample carries of its dataset: its label (the folder's name), loss weight and whether it regularises."""
    label = Path(cfg.folder).expanduser().name or str(cfg.folder)
    return {"dataset": label, "loss_weight": float(cfg.loss_weight), "regularization": bool(cfg.is_regularization),
            "transparency": cfg.transparency}


def keeps_alpha(decode: str, transparency: str, family_keeps_transparency: bool) -> bool:
    """Whether an image (a sample, or a control image of it, by its `decode` tag) is encoded with its alpha: it has
    transparency, its dataset's `transparency` does not flatten it, and the model's VAE encodes alpha
    (`ModelFamily.keeps_transparency`). An opaque image is the same either way (an RGBA VAE's pipeline makes it
    opaque RGBA)."""
    return family_keeps_transparency and decode.startswith("alpha") and transparency != "flatten"


def discover(cfg: DatasetConfig, exclude=None) -> list[Sample]:
    """Find every image with its caption and bucket; the list is sorted by file name.

    `exclude(path)`: images that are not training targets (an edit dataset's control images, data/edit_dataset.py)."""
    if not cfg.folder.strip():
        raise UserInputError("no dataset folder given. Point it at a folder of images with .txt captions.")
    folder = Path(cfg.folder).expanduser().absolute()  # errors name the folder looked in, in full
    if not folder.is_dir():
        raise UserInputError(
            f"dataset folder {str(folder)!r} does not exist. Point it at a folder of images with .txt captions."
        )
    try:
        entries = sorted(folder.iterdir())
    except PermissionError:
        raise UserInputError(
            f"dataset folder {folder} cannot be listed: permission denied. Let the user that runs ComfyUI read it "
            f"(for example: chmod a+rx '{folder}')."
        ) from None
    except OSError as e:
        raise UserInputError(f"dataset folder {folder} cannot be listed ({e.strerror or e}). Check the disk.") from None
    # Every entry with an image extension is an image (a folder or broken link named so is an error, not
    # skipped), except hidden files: macOS leaves '._name.png' companions that are no images.
    images = [p for p in entries if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")]
    not_targets = {p for p in images if exclude is not None and exclude(p)}
    from .masks import MaskFiles  # (masks.py builds on this module)

    masks = MaskFiles(folder, [p for p in images if p not in not_targets], sorted(not_targets), cfg)  # pairs them
    paths = masks.images
    if not paths:
        excluded = [p.name for p in entries if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")]
        if excluded:  # all of them named as control images (an edit dataset): say so, not "no images"
            raise UserInputError(
                f"dataset folder {folder} has no training images: its {len(excluded)} images (first: {excluded[0]}) "
                f"are all named as control images (<name>_control). A training image is <name>.png with its caption "
                f"<name>{cfg.caption_extension}; its control is <name>_control.png (an image with its own caption "
                "is always a training image).")
        raise UserInputError(
            f"dataset folder {folder} has no images ({', '.join(IMAGE_EXTENSIONS)}). Add images with "
            "same-name .txt captions."
        )
    buckets = bucket_sizes(cfg)
    options = decode_options(cfg)
    samples = []
    for path in paths:
        data = read_file(path)
        img, decode = decode_image(data, path, **options)
        bucket = choose_bucket(img.width, img.height, buckets)
        check_size(path.name, img.width, img.height, bucket, cfg)
        samples.append(Sample(
            image_path=str(path), caption=read_caption(path, cfg), width=img.width, height=img.height,
            bucket=bucket, image_sha256=hashlib.sha256(data).hexdigest(), decode=decode, **options,
            mask=masks.read(path, img.size, cfg.allow_large_images),
            **dataset_fields(cfg),
        ))
    return samples


def check_size(name: str, width: int, height: int, bucket: tuple[int, int], cfg: DatasetConfig) -> None:
    if cfg.upscale_small_images:
        return
    scale = max(bucket[0] / width, bucket[1] / height)
    if scale > 1.0:
        raise UserInputError(
            f"image {name} is {width}x{height}, smaller than its {bucket[0]}x{bucket[1]} bucket at resolution "
            f"{cfg.resolution}. Lower the resolution, enable upscale_small_images, or remove the image."
        )


def load_cropped(path: str | Path, bucket: tuple[int, int], background: tuple[int, int, int] = WHITE,
                 allow_large_images: bool = False) -> torch.Tensor:
    """Resize to cover the bucket, centre-crop to it, return (3, H, W) in [-1, 1], fp32."""
    return pil_to_tensor(cropped_image(path, bucket, background, allow_large_images))


def cropped_image(path: str | Path, bucket: tuple[int, int], background: tuple[int, int, int] = WHITE,
                  allow_large_images: bool = False, keep_alpha: bool = False) -> Image.Image:
    """The image resized to cover the bucket and centre-cropped to it: RGB, or RGBA with `keep_alpha` when it has
    transparency (Pillow resizes RGBA premultiplied, so a transparent pixel's colour does not bleed into its
    neighbours)."""
    img = open_image(Path(path), background, allow_large_images, keep_alpha)
    bw, bh = bucket
    scale = max(bw / img.width, bh / img.height)
    size = (max(bw, round(img.width * scale)), max(bh, round(img.height * scale)))
    img = img.resize(size, Image.Resampling.LANCZOS)
    left, top = (size[0] - bw) // 2, (size[1] - bh) // 2
    return img.crop((left, top, left + bw, top + bh))
