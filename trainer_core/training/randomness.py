"""Training's randomness, derived from counters: every draw is a pure function of (seed, micro-batch, purpose).

A run counts its micro-batches over all processes and all steps (`m` = 0, 1, 2, ...; optimizer step s with
n micro-batches per step takes m = n*s .. n*s + n - 1 when no step was skipped). Each random draw of
micro-batch m (its noise, its noise levels, its caption dropout, its LoRA dropout masks) comes from a
generator seeded by hashing (run seed, m, purpose). So:
- nothing is replayed: modulation ahead computes the noise levels of the next forwards directly;
- a process draws only its own micro-batches (data parallel: micro-batch k of a step is process k mod N's);
- the only randomness state to checkpoint is the counter, which the data order keeps anyway;
- results depend neither on the device's RNG nor on what other code draws in between.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch

# What a micro-batch draws. The names are part of the checkpoint format (a renamed purpose draws other
# numbers): change them only with checkpoint.FORMAT_VERSION.
NOISE = "noise"
NOISE_LEVELS = "noise levels"
CAPTION_DROPOUT = "caption dropout"
LORA_DROPOUT = "lora dropout"


def counter_seed(seed: int, micro_batch: int, purpose: str) -> int:
    """A 63-bit seed for `purpose` of micro-batch `micro_batch` of a run seeded `seed` (torch takes < 2**63)."""
    digest = hashlib.sha256(f"{seed}/{micro_batch}/{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def generator(seed: int, micro_batch: int, purpose: str) -> torch.Generator:
    """A CPU generator for one purpose of one micro-batch (CPU draws: the same numbers on every device)."""
    return torch.Generator().manual_seed(counter_seed(seed, micro_batch, purpose))


def seed_global_rng(seed: int, micro_batch: int, device: torch.device) -> None:
    """Seed torch's global RNG for LoRA dropout (peft's dropout draws from it) on the CPU and on `device`
    (only there: another GPU of the machine is another process's)."""
    value = counter_seed(seed, micro_batch, LORA_DROPOUT)
    torch.random.default_generator.manual_seed(value)
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.manual_seed(value)


@contextmanager
def global_rng_kept(device: torch.device) -> Iterator[None]:
    """Training seeds torch's global RNG per micro-batch; put the caller's state back afterwards, so a host's
    own draws (ComfyUI's samplers, a script's) are not changed by training in between."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield
