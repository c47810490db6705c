"""Aspect-ratio buckets: the sizes a dataset's images are cropped to (about resolution^2 pixels each, sides multiples
of BUCKET_STEP within the side limits), and the bucket an image of a given size goes in."""

from __future__ import annotations

import math

from ..core.config import DatasetConfig

BUCKET_STEP = 32


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
