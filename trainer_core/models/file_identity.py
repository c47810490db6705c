"""The identity of a model file without loading it: its size, its header and bytes sampled across its data.

Cache keys and run signatures name the model that made them. Hashing the weights would need the weights
in memory (20 GB for the transformer, 15 GB for the text encoder) on every run, even one whose every
latent and prompt is cached already; hashing the whole file would read all of it. A safetensors file's
header already names every tensor with its dtype, shape and byte range, so two files with equal headers
differ only in their values, and two trainings (or quantisations) of a model differ in effectively every
tensor: a few kilobytes sampled evenly over the data tell them apart. The path is not part of it, so a
moved or renamed file keeps its identity (and its cache).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

# How the identity is computed; a change of the recipe changes every identity (and misses every cache).
IDENTITY_RECIPE = "file-identity-1"
SAMPLES = 64  # windows read across the data section
SAMPLE_BYTES = 4096  # bytes per window: 256 KiB in all, whatever the file's size


def file_identity(path: str | Path) -> str:
    """A 24-hex-digit identity of the safetensors file at `path` (see the module docstring)."""
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256(f"{IDENTITY_RECIPE}|{size}|".encode())
    with open(path, "rb", buffering=0) as f:
        length = int.from_bytes(f.read(8), "little")
        h.update(f.read(length))  # names, dtypes, shapes, byte ranges, metadata
        data_start = 8 + length
        span = max(0, size - data_start - SAMPLE_BYTES)
        for k in range(SAMPLES):
            f.seek(data_start + span * k // max(1, SAMPLES - 1))
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()[:24]


def identity_bytes_read(path: str | Path) -> int:
    """At most this many bytes are read to compute the identity of `path` (header included)."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
    return 8 + length + SAMPLES * SAMPLE_BYTES


def combined_identity(*parts: str) -> str:
    """One identity for several (e.g. a text encoder file and its tokenizer's vocabulary)."""
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]
