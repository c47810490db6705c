"""A dataset from images a host's graph made (ComfyUI's IMAGE and MASK batches), written as a dataset folder.

The graph's pictures become the same thing a Dataset node reads: a folder of `image_NNNN.png` with its caption
`image_NNNN.txt` and, where a mask was given, `image_NNNN_mask.png` (masks.py's convention beside the image). So
buckets, crops, masks, validation and transparency work exactly as for a folder, and the cache keys are the files'
bytes: the same pixels write the same PNG bytes, so an unchanged batch is not encoded again and a changed picture is.

The folder is named by a hash of the pixels, masks and captions (`batch_key`), inside the host's output folder; an
existing folder of that name is used as it is, a new one is written under a temporary name and renamed into place,
so a killed write never leaves a half folder under the real name.

Pixels are stored at 8 bits per channel (ComfyUI's own Save Image does the same): two batches that differ by less
than 1/255 are one dataset.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..core.config import DatasetConfig
from ..core.errors import UserInputError
from ..core.fields import _f
from .images import Dataset, load_dataset


@dataclass
class GraphImagesConfig:
    """What a graph's pictures need beside the folder dataset's settings (DatasetConfig): their captions."""

    captions: str = _f("", "One caption per line, in the batch's order, or one line for every picture.",
                       multiline=True)


GRAPH_LABEL = "graph images"  # the dataset's label in loss reports (a folder dataset's is its folder's name)
STEM = "image_{:04d}"


def batch_to_uint8(images: torch.Tensor) -> np.ndarray:
    """A host IMAGE batch (B, H, W, C) float in [0, 1], C 3 (RGB) or 4 (RGBA) -> (B, H, W, C) uint8."""
    if images.ndim == 3:  # one picture without its batch dimension
        images = images.unsqueeze(0)
    if images.ndim != 4 or images.shape[-1] not in (3, 4) or images.shape[0] == 0:
        raise UserInputError(
            f"images has shape {tuple(images.shape)}: expected an IMAGE batch (batch, height, width, 3 or 4 channels), "
            "e.g. from Load Image: wire an IMAGE output into it.")
    pixels = images.detach().to("cpu", torch.float32).clamp(0, 1)
    return (pixels * 255).round().to(torch.uint8).numpy()


def masks_to_uint8(masks: torch.Tensor | None, count: int, size: tuple[int, int]) -> np.ndarray | None:
    """A host MASK batch (B, H, W) or one mask (H, W) in [0, 1] -> (count, H, W) uint8 (one mask for every image when
    one is given); None for no mask. `size`: the images' (height, width)."""
    if masks is None:
        return None
    if masks.ndim == 2:
        masks = masks.unsqueeze(0)
    if masks.ndim != 3:
        raise UserInputError(f"mask has shape {tuple(masks.shape)}: expected a MASK batch (batch, height, width).")
    if not bool((masks > 0).any()):  # also Load Image's 64x64 mask of a picture without transparency
        raise UserInputError(
            "mask is 0 everywhere, so nothing would train (Load Image gives such a mask for a picture without "
            "transparency): leave mask unconnected to train every pixel, or give a mask that is 1 where to train.")
    if tuple(masks.shape[1:]) != tuple(size):
        raise UserInputError(
            f"mask is {masks.shape[2]}x{masks.shape[1]} pixels but the images are {size[1]}x{size[0]}: give masks of "
            "the images' size (crop or scale the mask as the images were).")
    if masks.shape[0] not in (1, count):
        raise UserInputError(
            f"mask holds {masks.shape[0]} masks for {count} images: give one mask per image, or one for all.")
    values = (masks.detach().to("cpu", torch.float32).clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    return np.repeat(values, count, axis=0) if values.shape[0] == 1 and count > 1 else values


def split_captions(captions: str, count: int) -> list[str]:
    """One caption per image: the text's non-empty lines, one per image, or its one line for every image."""
    lines = [line.strip() for line in captions.splitlines() if line.strip()]
    if not lines:
        raise UserInputError(
            "captions is empty: type one caption for all the images, or one caption per line (one line per image, "
            "in the batch's order).")
    if len(lines) == 1:
        return lines * count
    if len(lines) != count:
        raise UserInputError(
            f"captions has {len(lines)} lines for {count} images: give one line per image (in the batch's order), or "
            "a single line for all of them.")
    return lines


def png_bytes(array: np.ndarray) -> bytes:
    """One (H, W, C) or (H, W) uint8 picture as PNG bytes (the same array always gives the same bytes)."""
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def batch_key(pixels: np.ndarray, masks: np.ndarray | None, captions: list[str]) -> str:
    """16 hex digits naming the batch's folder: its pixels (and shape), masks and captions."""
    h = hashlib.sha256()
    h.update(repr(pixels.shape).encode())
    h.update(pixels.tobytes())
    if masks is not None:
        h.update(b"mask")
        h.update(masks.tobytes())
    for caption in captions:
        h.update(b"\0" + caption.encode())
    return h.hexdigest()[:16]


def write_batch_folder(root: str | Path, pixels: np.ndarray, masks: np.ndarray | None, captions: list[str]) -> Path:
    """The batch as a dataset folder inside `root` (named by `batch_key`; an existing one is kept as it is)."""
    root = Path(root)
    final = root / batch_key(pixels, masks, captions)
    if final.is_dir():
        return final
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        for i, (picture, caption) in enumerate(zip(pixels, captions), start=1):
            stem = STEM.format(i)
            (tmp / f"{stem}.png").write_bytes(png_bytes(picture))
            (tmp / f"{stem}.txt").write_text(caption + "\n", encoding="utf-8")
            if masks is not None:
                (tmp / f"{stem}_mask.png").write_bytes(png_bytes(masks[i - 1]))
        os.replace(tmp, final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if final.is_dir():  # another writer of the same batch got there first: its folder holds the same files
            return final
        raise UserInputError(
            f"the graph's images cannot be written to {final} ({e.strerror or e}): free disk space or let ComfyUI "
            "write to its output folder.") from None
    return final


def graph_dataset(root: str | Path, images: torch.Tensor, captions: str, masks: torch.Tensor | None = None,
                  **settings) -> Dataset:
    """The Dataset of a host's IMAGE batch (B, H, W, C), its captions and optional MASK batch (1 trains, 0 weighs
    mask_background_weight), with the folder node's settings that apply (`settings`: DatasetConfig fields)."""
    pixels = batch_to_uint8(images)
    folder = write_batch_folder(root, pixels, masks_to_uint8(masks, len(pixels), pixels.shape[1:3]),
                                split_captions(captions, len(pixels)))
    dataset = load_dataset(DatasetConfig(folder=str(folder), **settings))
    label = lambda samples: tuple(dataclasses.replace(s, dataset=GRAPH_LABEL) for s in samples)  # noqa: E731
    return Dataset(dataset.config, label(dataset.samples), label(dataset.validation))
