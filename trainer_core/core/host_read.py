"""Reading values from the device: the point where the host waits for the device's queued work (a host sync).

A training step reads its loss, its losses' finiteness and its gradient norm in one such read (`read_to_host` of one
small stacked tensor) instead of a `.item()` each, so the host does not stall the device's queue several times a
step. The copy is made explicit (`copy=True`) so that a CPU run dispatches it as well, and a count of host reads
(`aten._to_copy` to the CPU and `aten._local_scalar_dense`, i.e. `.item()` / `bool()` / `float()` of a tensor) is
the same on the CPU as on a GPU (tests/engine/test_host_syncs.py).
"""

from __future__ import annotations

import torch


def read_to_host(values: torch.Tensor) -> list[float]:
    """`values` (a 1-d tensor, any device) as Python floats: one host sync."""
    return values.detach().to("cpu", copy=True).tolist()
