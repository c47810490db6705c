"""The host RAM of a whole machine that runs several processes of one run (torchrun, one process per GPU).

The processes of a machine share one host copy of the frozen weights (`streaming.shared_host`), so per phase of
`phases.plan_phases` the machine holds
    the shared part once          the streamed blocks' masters (exact bytes: no arena rounding in a shared copy),
    process 0's own part once     what only the writing process holds: the VAE for previews, a checkpoint's copy,
                                  the LoRA file's tensors, and caching (the others wait and then read its cache),
    N x every process's part      Python and the libraries, the cached latents and prompt embeddings, the tensor
                                  in flight while each process reads its GPU's share of the file.
Every GPU holds the same as the one GPU of a single process (`plan.plan_memory`): data parallel keeps a whole
model per GPU. Pure arithmetic, like the rest of the planner.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import UserInputError
from .phases import AFTER_CACHING, HOST_RESERVE_BYTES, PhasePlan
from .plan import GIB, Term

SHARED_TERMS = ("CPU master of swapped blocks",)
GONE_WHEN_SHARED = ("pinned arena slack", "pinned chunk being filled")  # the shared copy: exact bytes, no chunks
WRITER_TERMS = ("VAE, kept on the CPU for previews", "checkpoint copy", "LoRA file tensors")
EVERY_PROCESS_TERMS = ("process baseline",)


@dataclass(frozen=True)
class MachinePhase:
    """One phase's host RAM on the machine, split by who holds it."""

    shared: list[Term]  # once per machine
    writer: list[Term]  # process 0 alone
    each: list[Term]  # every process

    def bytes(self, processes: int) -> int:
        return sum(t.bytes for t in self.shared) + sum(t.bytes for t in self.writer) + processes * sum(
            t.bytes for t in self.each)


def split_phase(name: str, host: list[Term]) -> MachinePhase:
    shared, writer, each = [], [], []
    for t in host:
        if t.name.startswith(GONE_WHEN_SHARED):
            continue
        if t.name.startswith(SHARED_TERMS):
            shared.append(t)
        elif t.name.startswith(WRITER_TERMS) or (name == "cache" and not t.name.startswith(EVERY_PROCESS_TERMS)):
            writer.append(t)
        else:
            each.append(t)
    return MachinePhase(shared, writer, each)


@dataclass(frozen=True)
class MachinePlan:
    processes: int
    phases: dict[str, MachinePhase]
    ram_bytes: int | None  # the machine's RAM; usable: less HOST_RESERVE_BYTES
    gpu_bytes: int  # every GPU's training peak (each GPU holds the same)

    def host_bytes(self, phase: str) -> int:
        return self.phases[phase].bytes(self.processes)

    @property
    def peak(self) -> tuple[str, int]:
        return max(((name, self.host_bytes(name)) for name in self.phases), key=lambda item: item[1])

    @property
    def usable_ram_bytes(self) -> int | None:
        return None if self.ram_bytes is None else self.ram_bytes - HOST_RESERVE_BYTES

    def fits(self, processes: int | None = None) -> bool:
        n = self.processes if processes is None else processes
        return self.ram_bytes is None or all(p.bytes(n) <= self.usable_ram_bytes for p in self.phases.values())

    def most_processes(self) -> int:
        """The most processes whose phases fit the RAM (0: not even one)."""
        n = 0
        while n < 1024 and self.fits(n + 1):
            n += 1
        return n


def plan_machine(phases: PhasePlan, processes: int, names: tuple[str, ...] | None = None) -> MachinePlan:
    """The machine's host RAM for `processes` processes of the run `phases` plans (for one process)."""
    chosen = {n: p for n, p in phases.phases.items() if names is None or n in names}
    return MachinePlan(processes, {n: split_phase(n, p.host) for n, p in chosen.items()}, phases.ram_bytes,
                       phases.training.gpu_total)


def render_machine(plan: MachinePlan) -> str:
    n = plan.processes
    name, peak = plan.peak
    lines = [f"Host RAM of the machine, {n} processes (one per GPU, one shared host copy of the frozen weights):",
             f"{'phase':<9}{'shared':>10}{'process 0':>12}{'each':>10}{'machine':>11}", "-" * 52]
    for phase_name, phase in plan.phases.items():
        shared, writer, each = (sum(t.bytes for t in terms) / GIB for terms in (phase.shared, phase.writer, phase.each))
        lines.append(f"{phase_name:<9}{shared:>6.2f} GiB{writer:>8.2f} GiB{each:>6.2f} GiB"
                     f"{phase.bytes(n) / GIB:>7.2f} GiB")
    lines.append(f"machine peak ({name}): {peak / GIB:.2f} GiB = shared once + process 0's own + {n} x each")
    lines.append(f"per GPU: {plan.gpu_bytes / GIB:.2f} GiB at the training peak, the same on each of the {n} GPUs")
    if plan.ram_bytes is not None:
        verdict = "fits" if plan.fits() else f"does NOT fit: at most {plan.most_processes()} processes do"
        lines.append(f"RAM {plan.ram_bytes / GIB:.2f} GiB, {plan.usable_ram_bytes / GIB:.2f} usable "
                     f"({HOST_RESERVE_BYTES / GIB:.0f} GiB left to the system): {verdict}")
    return "\n".join(lines)


def refuse_if_machine_unfit(plan: MachinePlan) -> None:
    """A UserInputError when the machine's RAM does not hold its processes' phases: it names the shared copy, each
    process's part and how many processes would fit."""
    if plan.fits():
        return
    name, peak = plan.peak
    phase = plan.phases[name]
    parts = "; ".join(f"{t.name} {t.bytes / GIB:.2f} GiB" for t in phase.each)
    shared = sum(t.bytes for t in phase.shared) + sum(t.bytes for t in phase.writer)
    most = plan.most_processes()
    would = (f"start at most {most} process{'es' if most != 1 else ''} on this machine (torchrun --nproc-per-node "
             f"{most})" if most else "no number of processes fits: stream fewer blocks or free RAM")
    raise UserInputError(
        f"{plan.processes} processes on this machine need {peak / GIB:.2f} GiB of host RAM in the {name} phase, and "
        f"{plan.usable_ram_bytes / GIB:.2f} GiB are usable ({plan.ram_bytes / GIB:.1f} GiB less "
        f"{HOST_RESERVE_BYTES / GIB:.0f} GiB for the system): {shared / GIB:.2f} GiB once (the shared host copy of "
        f"the frozen weights and process 0's own) plus {plan.processes} x "
        f"{sum(t.bytes for t in phase.each) / GIB:.2f} GiB per process ({parts}). To fit, {would}, or add RAM.")


__all__ = ["AFTER_CACHING", "MachinePlan", "plan_machine", "refuse_if_machine_unfit", "render_machine"]
