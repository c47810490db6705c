"""The machine's host memory with 1, 2 and 4 processes of one run, with and without one shared host copy of the
frozen weights (issue 23).

    .venv/bin/python benchmarks/host_memory.py [--blocks 4] [--cap-gib 6] [--cases 1,2p,2,4]

A transformer of real width (3072, float8 block Linears) with `--blocks` blocks is written to a temporary folder
(`devtools.random_files`); each case starts `torchrun --standalone --nproc-per-node N` on this script's worker in a
memory cgroup capped at `--cap-gib` (`memory_cap.py`). Every worker loads the transformer on the CPU (every weight in
host memory, as on a CPU device), all at once as a run's processes do: the first reads the file and shares its copy,
the others wait for it and load from it, reading no weight from the file (`training.host_copy`, as Init Trainer
does; the case "Np" sets TRAINER_CORE_HOST_COPY=private: every process reads its own). Process 0 sums the
proportional set size (Pss of /proc/<pid>/smaps_rollup) of every worker and of torchrun's agent: memory mapped by k
processes counts 1/k in each, so the sum is the machine's total; while the workers load it samples that sum every
20 ms (the loading peak), and once the weights are in place, before training, it takes it again with each worker's
parts (anonymous, files, shared memory); training adds per process what one process adds (gradients, optimizer
state, activations). Prints one JSON line per case, with the weight bytes each worker read from the file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]
GIB = 1 << 30


ROLLUP = ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem")  # what /proc/<pid>/smaps_rollup says of a process


def rollup(pid: int) -> dict[str, int]:
    """The proportional set size of `pid` in bytes, and its parts: anonymous memory (the process's own), files
    (libraries, shared among processes), shared memory (the host copy's memory file)."""
    values = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name = line.split(":")[0]
        if name in ROLLUP:
            values[name] = int(line.split()[1]) * 1024
    return values


def pss_bytes(pid: int) -> int:
    return rollup(pid).get("Pss", 0)


class PeakSampler:
    """Process 0, while every worker loads: the largest sum of Pss over `pids`, sampled every `every` seconds."""

    def __init__(self, pids: list[int], every: float = 0.02):
        import threading

        self.pids, self.every, self.peak = pids, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, sum(pss_bytes(pid) for pid in self.pids))
            except OSError:
                pass
            self._stop.wait(self.every)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, sum(pss_bytes(pid) for pid in self.pids))
        return self.peak


def worker(path: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from trainer_core.models.safetensors_file import TENSOR_BYTES_READ
    from trainer_core.models.transformer_file import TransformerFile
    from trainer_core.training.distributed import join
    from trainer_core.training.host_copy import attach_before_load, share_host_copy

    replicas = join()
    cpu = torch.device("cpu")
    pids = [os.getpid()]
    if replicas.size > 1:
        pids = [None] * replicas.size
        dist.all_gather_object(pids, os.getpid(), group=replicas.cpu_group)
    agent = os.getppid()  # torchrun's agent
    source = TransformerFile(path, storage="float8", compute_dtype=torch.float32)
    if replicas.size > 1:
        dist.barrier(group=replicas.cpu_group)
    sampler = PeakSampler([*pids, agent]) if replicas.rank == 0 else None
    # Every worker loads at once, as a run's processes do (training/setup.py): the machine's first reads the file and
    # posts its copy; the others wait for it and read from the file only what it does not hold (here: nothing).
    read = sum(TENSOR_BYTES_READ.values())
    posted = attach_before_load(replicas)
    model = source.load(cpu, given=posted.given if posted is not None else None)
    copy = share_host_copy(model, (), replicas, cpu, posted)
    read = sum(TENSOR_BYTES_READ.values()) - read
    reads = [read]
    if replicas.size > 1:
        dist.barrier(group=replicas.cpu_group)
        reads = [None] * replicas.size
        dist.all_gather_object(reads, read, group=replicas.cpu_group)
    loading_peak = sampler.stop() if sampler is not None else 0
    # Read every weight once, as a training step does: a mapped page counts in a process's memory once it has touched
    # it (before, the shared copy's pages are in the memory file but in nobody's page table, so in no Pss).
    checksum = sum(float(p.detach().float().sum()) for p in model.parameters())
    if replicas.size > 1:
        if copy is not None:
            copy.seal()
        dist.barrier(group=replicas.cpu_group)
    if replicas.rank == 0:
        workers = {pid: rollup(pid) for pid in pids}
        agent_pss = pss_bytes(agent)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        total = sum(w["Pss"] for w in workers.values())
        Path(out).write_text(json.dumps({
            "processes": replicas.size, "shared": copy is not None, "checksum": checksum,
            "weights_gib": weights / GIB, "weight_bytes_read_per_worker_gib": [r / GIB for r in reads],
            "workers_pss_gib": total / GIB, "agent_pss_gib": agent_pss / GIB,
            "machine_pss_gib": (total + agent_pss) / GIB, "loading_peak_machine_pss_gib": loading_peak / GIB,
            "per_worker_gib": [{k: round(v / GIB, 3) for k, v in w.items()} for w in workers.values()]}))
    if replicas.size > 1:
        dist.barrier(group=replicas.cpu_group)  # nobody leaves while process 0 reads the others' memory
    replicas.leave()


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--cap-gib", type=float, default=6.0)
    parser.add_argument("--cases", default="1,2p,2,4", help="process counts; a trailing p: private host copies")
    parser.add_argument("--worker", nargs=2, metavar=("FILE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    from memory_cap import run_capped

    if available_bytes() < (args.cap_gib + 2) * GIB:
        print(f"only {available_bytes() / GIB:.1f} GiB available: wait for other jobs (the cap is {args.cap_gib} GiB)")
        return 1
    from trainer_core.devtools.random_files import write_random_transformer

    results = []
    with tempfile.TemporaryDirectory() as folder:
        path = write_random_transformer(Path(folder) / "transformer.safetensors", {"num_layers": args.blocks})
        for case in args.cases.split(","):
            n, private = int(case.rstrip("p")), case.endswith("p")
            out = Path(folder) / f"case_{case}.json"
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
                       str(Path(__file__).resolve()), "--worker", str(path), str(out)]
            os.environ["TRAINER_CORE_HOST_COPY"] = "private" if private else "shared"
            code = run_capped(command, args.cap_gib, log=lambda text: print(text, file=sys.stderr))
            if code != 0:
                print(json.dumps({"case": case, "exit": code}))
                return 1
            result = {"case": case, **json.loads(out.read_text())}
            results.append(result)
            print(json.dumps(result), flush=True)
    one = next((r["machine_pss_gib"] for r in results if r["processes"] == 1), None)
    if one:
        for r in results:
            print(f"{r['processes']} process(es), {'shared' if r['shared'] else 'private'} host copy: "
                  f"{r['machine_pss_gib']:.2f} GiB = {r['machine_pss_gib'] / one:.2f} x one process; loading peak "
                  f"{r['loading_peak_machine_pss_gib']:.2f} GiB = {r['loading_peak_machine_pss_gib'] / one:.2f} x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
