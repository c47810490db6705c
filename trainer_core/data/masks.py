"""Loss masks: a grey image per training image that weights its loss per latent position.

Folder convention (either form; one mask per image, never both):

    name.png + name_mask.png        the mask beside its image (any image extension for either)
    name.png + masks/name.png       the mask in a `masks` subfolder, under the image's name

White trains, black is ignored, grey weighs value/255. The Dataset node's `mask_background_weight` b lifts
black to b: a mask value m in [0, 1] weighs lerp(b, 1, m) (b = 0: black ignored; b = 1: no masking). A
colour mask counts by its brightness (Pillow's "L" conversion, 0.299 R + 0.587 G + 0.114 B), transparent
pixels count as black, 16-bit grey is scaled by its full range (as images are, images.to_rgb); EXIF rotation
is applied. A name_mask image with its own caption is a training image (as a name_control one is in an edit
dataset). Images without a mask train everywhere (weight 1).

Geometry: the mask is resized and cropped exactly as its image (images.load_cropped: cover the bucket,
centre crop), then reduced by area to the latent grid (image / VAE factor, 8 for Qwen-Image). The loss
(training/masked_loss.py) is an element-wise MSE over packed tokens whose elements are single latent
positions x channels, so the latent grid is the finest grid it is computed at; the weights are packed with
the latents' own 2x2 packing and broadcast over the channels. Resizing uses Pillow's BOX filter (area
averaging; no ringing at the mask's edges, unlike the image's Lanczos), in float32 ("F" mode).

Errors name the file: a mask without its image, two masks for one image, a mask of a control image (Edit:
masks weight the target's loss only), a mask of another aspect ratio than its image, an all-black mask, a
mask that is not an image, and (at caching) a mask whose white part the crop cuts away entirely while black
weighs 0.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..core.config import DatasetConfig, field_default
from ..core.errors import UserInputError
from .images import IMAGE_EXTENSIONS, decode_image, read_file

MASK_SUFFIX = "_mask"
MASK_FOLDER = "masks"
BLACK = (0, 0, 0)
# Masks and images may differ in size (a mask drawn at half size), not in shape: aspect ratios this far apart
# (relative) are one shape, rounding of a scaled export.
ASPECT_TOLERANCE = 0.01
MASK_RECIPE = "L-box-cover-centre-crop-area"  # part of a mask entry's cache key: bump when the recipe changes


def masks_clause(samples, cfg: DatasetConfig) -> str:
    """A dataset summary's words on its masks: how many images have one and what black weighs; or, where no image
    has one and mask_background_weight is not its default, that the setting changes nothing (it was set for masks
    that are not there: misnamed, or in another folder)."""
    masked = sum(1 for s in samples if s.mask is not None)
    weight = cfg.mask_background_weight
    if masked:
        return f"; {masked} with a loss mask (black weighs {weight:g})"
    if weight != field_default(DatasetConfig, "mask_background_weight"):
        return (f"; warning: no image has a loss mask (name_mask.png beside it or masks/name.png), so "
                f"mask_background_weight={weight:g} changes nothing: add the masks, or leave the setting at its default")
    return ""


@dataclass(frozen=True)
class SampleMask:
    """A training image's loss mask as found on disk (`Sample.mask`)."""

    path: str
    sha256: str
    background_weight: float  # what black weighs (DatasetConfig.mask_background_weight)


def _images_in(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith("."))


def is_mask_name(path: Path, cfg: DatasetConfig) -> bool:
    """A name_mask image without its own caption (with one it is a training image named so)."""
    return path.stem.endswith(MASK_SUFFIX) and len(path.stem) > len(MASK_SUFFIX) and not (
        path.with_suffix(cfg.caption_extension).exists())


class MaskFiles:
    """The masks of one dataset folder, paired with its images by name (module docstring)."""

    def __init__(self, folder: Path, candidates: list[Path], excluded: list[Path], cfg: DatasetConfig):
        """`candidates`: the folder's image files that are not excluded (masks among them); `excluded`: images
        that are no training targets (an edit dataset's controls). Refuses, by name, masks that pair with no
        training image or with two masks for one."""
        self.cfg = cfg
        self.images = [p for p in candidates if not is_mask_name(p, cfg)]
        targets = {p.stem for p in self.images}
        others = {p.stem: p for p in excluded}
        beside = [(p.stem[: -len(MASK_SUFFIX)], p) for p in candidates if is_mask_name(p, cfg)]
        sub = [(p.stem, p) for p in _images_in(folder / MASK_FOLDER)]
        self.by_stem: dict[str, Path] = {}
        for stem, mask in beside + sub:
            if stem in others:
                raise UserInputError(
                    f"mask {mask} belongs to the control image {others[stem].name}: masks weight the loss of training "
                    "images only, and a control image is an input. Remove the mask (a mask of the target is "
                    f"<target>{MASK_SUFFIX}.png).")
            if stem not in targets:
                raise UserInputError(
                    f"mask {mask} belongs to no training image: {folder} has no image named '{stem}'. Add the image, "
                    f"rename or remove the mask (if {mask.name} is a training image itself, give it its caption "
                    f"{mask.with_suffix(cfg.caption_extension).name}).")
            if stem in self.by_stem:
                raise UserInputError(
                    f"image '{stem}' has two masks, {self.by_stem[stem]} and {mask}: keep one (beside the image as "
                    f"{stem}{MASK_SUFFIX}.png or in {MASK_FOLDER}/{stem}.png, whatever its extension).")
            self.by_stem[stem] = mask

    def read(self, image: Path, size: tuple[int, int], allow_large_images: bool) -> SampleMask | None:
        """The mask of `image` (its decoded (width, height) is `size`), checked; None without one."""
        path = self.by_stem.get(image.stem)
        if path is None:
            return None
        data = read_file(path, "mask")
        grey = decode_mask(data, path, allow_large_images)
        check_mask(grey, path, image, size)
        return SampleMask(path=str(path), sha256=hashlib.sha256(data).hexdigest(),
                          background_weight=float(self.cfg.mask_background_weight))


def decode_mask(data: bytes, path: Path, allow_large_images: bool = False) -> Image.Image:
    """A mask file's bytes as an 8-bit grey ("L") image (module docstring: colour, transparency, 16-bit)."""
    try:
        rgb, _ = decode_image(data, path, BLACK, allow_large_images)
    except UserInputError as e:
        if "fully transparent" in str(e):  # transparent counts as black
            raise _all_black(path) from None
        raise UserInputError(f"mask {path.name} is not a usable image: {e}") from None
    return rgb.convert("L")


def _all_black(path: Path) -> UserInputError:
    return UserInputError(
        f"mask {path} is all black: it marks nothing to train (with mask_background_weight 0 its image would train "
        "nothing, above 0 the mask changes nothing). White marks what to train: fix the mask (inverted?) or remove it "
        "to train the whole image.")


def check_mask(grey: Image.Image, path: Path, image: Path, size: tuple[int, int]) -> None:
    """Refuse a mask of another shape than its image, or one that is all black."""
    (mw, mh), (iw, ih) = grey.size, size
    if abs(mw * ih - mh * iw) > ASPECT_TOLERANCE * max(mw * ih, mh * iw):
        raise UserInputError(
            f"mask {path} is {mw}x{mh}, but its image {image.name} is {iw}x{ih}: another aspect ratio, so it cannot "
            "be laid onto the image. Export the mask at the image's size (or a scaled copy of it).")
    if grey.getextrema()[1] == 0:
        raise _all_black(path)


def mask_on_grid(mask: SampleMask, image_size: tuple[int, int], bucket: tuple[int, int], grid: tuple[int, int]
                 ) -> torch.Tensor:
    """(h, w) fp32 mask values m in [0, 1] on the latent grid `grid` (h, w) of an image of `image_size` (width,
    height) cropped to `bucket` (width, height) as images.load_cropped crops it."""
    grey = decode_mask(read_file(Path(mask.path), "mask"), Path(mask.path), allow_large_images=True)  # checked before
    values = Image.fromarray(np.asarray(grey, dtype=np.float32) / np.float32(255.0), mode="F")  # 255 -> exactly 1.0
    (iw, ih), (bw, bh) = image_size, bucket
    scale = max(bw / iw, bh / ih)  # as load_cropped: the image's size covering the bucket, then its centre crop
    size = (max(bw, round(iw * scale)), max(bh, round(ih * scale)))
    values = values.resize(size, Image.Resampling.BOX)  # from the mask's own size (the image's, or a scaled copy)
    left, top = (size[0] - bw) // 2, (size[1] - bh) // 2
    values = values.crop((left, top, left + bw, top + bh))
    h, w = grid
    if bh % h or bw % w or bh // h != bw // w:
        raise ValueError(f"latent grid {w}x{h} does not divide the bucket {bw}x{bh}")
    pixels = torch.from_numpy(np.array(values, dtype=np.float32))[None, None]  # (1, 1, bh, bw)
    return torch.nn.functional.avg_pool2d(pixels, bh // h)[0, 0]  # (h, w): the area mean of each cell


def loss_weights(mask: SampleMask, image_size: tuple[int, int], bucket: tuple[int, int], grid: tuple[int, int]
                 ) -> torch.Tensor:
    """(h, w) fp32 loss weights: lerp(background_weight, 1, m), so white weighs exactly 1 and black exactly the
    background weight. Refuses weights that are all 0 (the crop cut every white pixel away, black weighs 0)."""
    m = mask_on_grid(mask, image_size, bucket, grid)
    weights = torch.lerp(torch.full_like(m, mask.background_weight), torch.ones_like(m), m)
    if not bool(weights.gt(0).any()):
        raise UserInputError(
            f"mask {mask.path} keeps nothing of its image: the white part lies outside the {bucket[0]}x{bucket[1]} "
            "crop its image is trained at, and mask_background_weight is 0. Move the white part towards the centre, or "
            "raise mask_background_weight.")
    return weights


def mask_key(mask: SampleMask, image_size: tuple[int, int], bucket: tuple[int, int], vae_fingerprint: str,
             version: str) -> str:
    """A mask entry's cache key: the mask's bytes, its image's size and bucket, the VAE (its grid) and the
    background weight; so editing the mask (or the weight) makes a new entry."""
    parts = (version, MASK_RECIPE, mask.sha256, f"{image_size[0]}x{image_size[1]}", f"{bucket[0]}x{bucket[1]}",
             vae_fingerprint, repr(float(mask.background_weight)))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]
