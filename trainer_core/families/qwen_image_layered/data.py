"""A Layered dataset: per sample a composite image, its caption, and the RGBA layers it decomposes into.

Folder convention (the layers beside their composite, numbered from 1 without gaps):

    name.png + name.txt                        the composite (RGB or RGBA) and its caption
    name_layer_1.png, name_layer_2.png, ...    its layers, RGBA, each the composite's size

Layer N is the N-th image `QwenImageLayeredPipeline` returns for the composite (`images[0][N - 1]`; what a
layer tool exports as one RGBA file per layer). Any image extension works, but a layer must carry an alpha
channel (RGBA, LA, or a palette with transparency): a layer without one cannot say where it is empty.

The composite decides the bucket (as in text-to-image); every layer is resized and cropped exactly as its
composite, so they stay aligned. A loss mask beside the composite (name_mask.png or masks/name.png, as in
text-to-image) therefore weighs the composite and every layer alike (training/masked_loss.packed_weights). Errors name the file: a composite without layers, a layer whose composite
is missing, a gap in the numbers, a layer of another size, a layer without alpha.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from PIL import Image, ImageOps

from ...core.config import DatasetConfig
from ...core.errors import UserInputError
from ...data.images import IMAGE_EXTENSIONS, IMAGE_FORMATS, Dataset, Sample, discover, read_file, split_validation

LAYERED = "layered"  # a layered dataset (the Layered Dataset node's): `Sample.kind`
_LAYER = re.compile(r"^(?P<stem>.+)_layer_(?P<n>\d+)$")  # name_layer_1, name_layer_2, ...


@dataclass(frozen=True)
class LayerImage:
    path: str
    sha256: str


@dataclass(frozen=True)
class LayeredSample(Sample):
    """A composite `Sample` with its layers, in the pipeline's order (layer 1 first)."""

    kind: ClassVar[str] = LAYERED
    layers: tuple[LayerImage, ...] = ()


def is_layer_file(path: Path) -> bool:
    return bool(_LAYER.match(path.stem)) and path.suffix.lower() in IMAGE_EXTENSIONS


def open_rgba(path: str | Path, data: bytes | None = None) -> Image.Image:
    """An image file as RGBA (EXIF rotation applied; an image without alpha becomes opaque, as the pipeline's
    `convert("RGBA")` makes it). Errors name the file."""
    path = Path(path)
    data = read_file(path, "image") if data is None else data
    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
            return ImageOps.exif_transpose(img).convert("RGBA")
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise UserInputError(f"image {path} cannot be decoded ({e}). Re-export it as PNG.") from None


def _has_alpha(data: bytes) -> bool:
    with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
        return img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info


def find_layers(folder: Path, composites: list[Path]) -> dict[Path, list[Path]]:
    """composite path -> its layer paths in order, by the folder convention (module docstring)."""
    by_stem = {c.stem: c for c in composites}
    found: dict[str, dict[int, Path]] = {}
    for path in sorted(p for p in folder.iterdir() if is_layer_file(p) and not p.name.startswith(".")):
        match = _LAYER.match(path.stem)
        stem, n = match["stem"], int(match["n"])
        if stem not in by_stem:
            raise UserInputError(f"layer image {path} belongs to no composite: {folder} has no image named '{stem}' "
                                 f"(with its caption). Add {stem}.png or remove the layer.")
        slot = found.setdefault(stem, {})
        if n in slot or n < 1:
            why = "layer numbers start at 1" if n < 1 else f"{slot[n]} is layer {n} too"
            raise UserInputError(f"layer image {path}: {why}. Number the layers 1, 2, 3 ... once each.")
        slot[n] = path
    result = {}
    for composite in composites:
        numbered = found.get(composite.stem, {})
        if not numbered:
            raise UserInputError(f"image {composite.name} has no layers: add {composite.stem}_layer_1.png (RGBA), "
                                 f"{composite.stem}_layer_2.png, ... beside it; a Layered sample is a composite and "
                                 "its layers.")
        missing = [n for n in range(1, max(numbered) + 1) if n not in numbered]
        if missing:
            raise UserInputError(f"image {composite.name} has layer {max(numbered)} but not layer {missing[0]}: number "
                                 f"its layers 1, 2, 3 ... without gaps ({composite.stem}_layer_1.png, ...).")
        result[composite] = [numbered[n] for n in sorted(numbered)]
    return result


def read_layer(path: Path, composite: Sample) -> LayerImage:
    data = read_file(path, "layer image")
    try:
        alpha = _has_alpha(data)
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise UserInputError(f"layer image {path} cannot be decoded ({e}). Re-export it as an RGBA PNG.") from None
    if not alpha:
        raise UserInputError(f"layer image {path} has no alpha channel: a layer is RGBA, transparent where it is "
                             "empty. Export the layer with its transparency (PNG or WebP, RGBA).")
    size = open_rgba(path, data).size
    if size != (composite.width, composite.height):
        raise UserInputError(f"layer image {path} is {size[0]}x{size[1]}, but its composite "
                             f"{Path(composite.image_path).name} is {composite.width}x{composite.height}: a layer has "
                             "its composite's size. Export the layers at the composite's size.")
    return LayerImage(path=str(path), sha256=hashlib.sha256(data).hexdigest())


def discover_layered(cfg: DatasetConfig) -> list[LayeredSample]:
    """Every composite with caption, bucket and layers, sorted by file name (errors name the file)."""
    composites = discover(cfg, exclude=is_layer_file)
    folder = Path(cfg.folder).expanduser().absolute()
    layers = find_layers(folder, [Path(s.image_path) for s in composites])
    return [LayeredSample(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)},
                          layers=tuple(read_layer(p, s) for p in layers[Path(s.image_path)])) for s in composites]


@dataclass(frozen=True)
class LayeredDataset(Dataset):
    def summary(self) -> str:
        """As the text-to-image summary, without its transparency clause: Layered keeps the alpha channel."""
        counts: dict[int, int] = {}
        buckets: dict[tuple[int, int], int] = {}
        for s in self.samples:
            counts[len(s.layers)] = counts.get(len(s.layers), 0) + 1
            buckets[s.bucket] = buckets.get(s.bucket, 0) + 1
        layers = ", ".join(f"{n} with {k} layer{'s' if k > 1 else ''}" for k, n in sorted(counts.items()))
        listing = ", ".join(f"{w}x{h}: {n}" for (w, h), n in sorted(buckets.items()))
        held_out = (f"; {len(self.validation)} held out for validation: "
                    + ", ".join(Path(s.image_path).name for s in self.validation)) if self.validation else ""
        from ...data.masks import masks_clause

        return (f"{len(self.samples)} composites x {self.config.repeats} repeats; buckets {listing}; layered "
                f"samples: {layers} (RGBA, alpha kept){masks_clause(self.samples, self.config)}{held_out}")


def load_layered_dataset(cfg: DatasetConfig) -> LayeredDataset:
    """The layered samples, with `validation_images` of them held out as for text-to-image."""
    samples = discover_layered(cfg)
    training, validation = split_validation(samples, cfg)
    return LayeredDataset(config=cfg, samples=training, validation=validation)


def crop_rgba(image: Image.Image, bucket: tuple[int, int]) -> Image.Image:
    """Resize to cover the bucket and centre-crop to it, as `data.images.load_cropped` does, keeping alpha."""
    bw, bh = bucket
    scale = max(bw / image.width, bh / image.height)
    size = (max(bw, round(image.width * scale)), max(bh, round(image.height * scale)))
    image = image.resize(size, Image.Resampling.LANCZOS)
    left, top = (size[0] - bw) // 2, (size[1] - bh) // 2
    return image.crop((left, top, left + bw, top + bh))
