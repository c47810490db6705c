"""One phase of a run as the planner counts it: its GPU terms and its host RAM terms, and how device-side terms
become either (on CUDA with the allocator's slack and the CUDA context; on the CPU, host RAM)."""

from __future__ import annotations

from dataclasses import dataclass

from .plan import GIB, PlanInputs, Term, baseline_note, process_baseline

# Host RAM the planner leaves to the operating system, a desktop and other programs (assumed).
HOST_RESERVE_BYTES = 4 * GIB


@dataclass(frozen=True)
class Phase:
    name: str
    gpu: list[Term]  # on the GPU (empty when the device is the CPU)
    host: list[Term]  # in host RAM, the process's baseline included
    note: str = ""

    @property
    def gpu_bytes(self) -> int:
        return sum(t.bytes for t in self.gpu)

    @property
    def host_bytes(self) -> int:
        return sum(t.bytes for t in self.host)


def on_device(p: PlanInputs, allocated: list[Term], host: list[Term], name: str, note: str = "") -> Phase:
    """A phase from its device-side and host-side terms: on CUDA the device terms get allocator slack and the
    CUDA context (as plan_memory counts them); on the CPU they are host RAM."""
    allocated = [t for t in allocated if t.bytes]
    if p.device != "cuda":
        return Phase(name, [], host + [Term(f"{t.name} (device = CPU)", t.bytes, t.note) for t in allocated], note)
    total = sum(t.bytes for t in allocated)
    gpu = allocated + [Term("allocator slack", int(total * p.allocator_slack), f"assumed {p.allocator_slack:.0%}"),
                       Term("CUDA context", p.cuda_context_bytes, "assumed, outside torch's allocator")]
    return Phase(name, gpu, host, note)


def baseline(p: PlanInputs) -> Term:
    return Term("process baseline", process_baseline(p), baseline_note(p))


