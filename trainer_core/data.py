"""Training images and captions: discovery, aspect-ratio buckets, resize and centre crop.

Buckets have sides that are multiples of 32 px (so both the real VAE's 16 px and the tiny one's 8 px
token grid divide them, and the token grid is always even: ComfyUI centres RoPE positions one place off
from diffusers on odd grids). Each bucket holds about `resolution`^2 pixels.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from .config import DatasetConfig
from .errors import UserInputError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp")
BUCKET_STEP = 32


@dataclass(frozen=True)
class Sample:
    """One training image as found on disk (before encoding)."""

    image_path: str
    caption: str
    width: int  # original size, after EXIF rotation
    height: int
    bucket: tuple[int, int]  # (width, height) it is cropped to
    image_sha256: str


@dataclass(frozen=True)
class Dataset:
    """A discovered dataset: its settings and its samples."""

    config: DatasetConfig
    samples: tuple[Sample, ...]

    def summary(self) -> str:
        buckets: dict[tuple[int, int], int] = {}
        for s in self.samples:
            buckets[s.bucket] = buckets.get(s.bucket, 0) + 1
        listing = ", ".join(f"{w}x{h}: {n}" for (w, h), n in sorted(buckets.items()))
        return f"{len(self.samples)} images x {self.config.repeats} repeats; buckets {listing}"


def folder_state(folder: str | Path) -> str:
    """A cheap token that changes when any file in `folder` is added, removed or modified."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return "missing"
    h = hashlib.sha256()
    for p in sorted(folder.iterdir()):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()


def load_dataset(cfg: DatasetConfig) -> Dataset:
    return Dataset(config=cfg, samples=tuple(discover(cfg)))


def bucket_sizes(cfg: DatasetConfig) -> list[tuple[int, int]]:
    """All (width, height) buckets of about resolution^2 pixels within the side limits."""
    if not cfg.enable_buckets:
        return [(cfg.resolution, cfg.resolution)]
    area = cfg.resolution * cfg.resolution
    sizes = set()
    for width in range(cfg.min_bucket_side, cfg.max_bucket_side + 1, BUCKET_STEP):
        height = int(area / width) // BUCKET_STEP * BUCKET_STEP
        if cfg.min_bucket_side <= height <= cfg.max_bucket_side:
            sizes.add((width, height))
    sizes.add((cfg.resolution, cfg.resolution))
    return sorted(sizes)


def choose_bucket(width: int, height: int, buckets: list[tuple[int, int]]) -> tuple[int, int]:
    """The bucket whose aspect ratio is closest (in log space) to the image's."""
    aspect = math.log(width / height)
    return min(buckets, key=lambda b: (abs(math.log(b[0] / b[1]) - aspect), -b[0] * b[1]))


def read_caption(image_path: Path, cfg: DatasetConfig) -> str:
    caption_path = image_path.with_suffix(cfg.caption_extension)
    if not caption_path.is_file():
        if cfg.missing_caption == "empty":
            return ""
        raise UserInputError(
            f"image {image_path.name} has no caption file {caption_path.name} in {image_path.parent}. "
            "Add the caption, or set missing_caption to 'empty' to train it without one."
        )
    try:
        return caption_path.read_bytes().decode("utf-8-sig").strip()
    except UnicodeDecodeError as e:
        raise UserInputError(
            f"caption {caption_path} is not UTF-8 text (byte {e.start}). Re-save it as UTF-8."
        ) from None


def open_image(path: Path) -> Image.Image:
    """Open, fully decode, apply EXIF rotation and convert to RGB; errors name the file."""
    try:
        with Image.open(path) as img:
            img.load()
            return ImageOps.exif_transpose(img).convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise UserInputError(
            f"image {path} cannot be read ({type(e).__name__}: {e}). Re-export it or remove it from the folder."
        ) from None


def discover(cfg: DatasetConfig) -> list[Sample]:
    """Find every image with its caption and bucket; the list is sorted by file name."""
    cfg.validate()
    folder = Path(cfg.folder).expanduser()
    if not cfg.folder or not folder.is_dir():
        raise UserInputError(
            f"dataset folder {cfg.folder!r} does not exist. Point it at a folder of images with .txt captions."
        )
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
    if not paths:
        raise UserInputError(
            f"dataset folder {folder} has no images ({', '.join(IMAGE_EXTENSIONS)}). Add images with "
            "same-name .txt captions."
        )
    buckets = bucket_sizes(cfg)
    samples = []
    for path in paths:
        data = path.read_bytes()
        img = open_image(path)
        bucket = choose_bucket(img.width, img.height, buckets)
        check_size(path.name, img.width, img.height, bucket, cfg)
        samples.append(Sample(
            image_path=str(path), caption=read_caption(path, cfg), width=img.width, height=img.height,
            bucket=bucket, image_sha256=hashlib.sha256(data).hexdigest(),
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


def load_cropped(path: str | Path, bucket: tuple[int, int]) -> torch.Tensor:
    """Resize to cover the bucket, centre-crop to it, return (3, H, W) in [-1, 1], fp32."""
    img = open_image(Path(path))
    bw, bh = bucket
    scale = max(bw / img.width, bh / img.height)
    size = (max(bw, round(img.width * scale)), max(bh, round(img.height * scale)))
    img = img.resize(size, Image.Resampling.LANCZOS)
    left, top = (size[0] - bw) // 2, (size[1] - bh) // 2
    img = img.crop((left, top, left + bw, top + bh))
    return pil_to_tensor(img)


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """PIL RGB -> (3, H, W) float in [-1, 1]."""
    array = np.asarray(img, dtype=np.float32) / 127.5 - 1.0  # (H, W, 3)
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def tensor_to_pil(image: torch.Tensor) -> Image.Image:
    """(3, H, W) in [-1, 1] -> PIL RGB."""
    array = ((image.float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(array)
