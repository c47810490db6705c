"""The machine's host memory with 1, 2 and 4 processes of one run, with and without one shared host copy of the
frozen weights (issue 23).

    .venv/bin/python benchmarks/host_memory.py [--blocks 4] [--cap-gib 6] [--cases 1,2p,2,4]

A transformer of real width (3072, float8 block Linears) with `--blocks` blocks is written to a temporary folder
(`devtools.random_files`); each case starts `torchrun --standalone --nproc-per-node N` on this script's worker in a
memory cgroup capped at `--cap-gib` (`memory_cap.py`). Every worker loads the transformer on the CPU (every weight in
host memory, as on a CPU device; one process after the other, see `worker`), shares it
(`training.host_copy.share_host_copy`, as Init Trainer does; the case
"Np" sets TRAINER_CORE_HOST_COPY=private), waits for all, and process 0 sums the proportional set size (Pss of
/proc/<pid>/smaps_rollup) of every worker and of torchrun's agent: memory mapped by k processes counts 1/k in each,
so the sum is the machine's total. Measured once the weights are in place, before training (training adds per
process what one process adds: gradients, optimizer state, activations). Prints one JSON line per case.
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


def pss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def worker(path: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from trainer_core.models.transformer_file import TransformerFile
    from trainer_core.training.distributed import join
    from trainer_core.training.host_copy import share_host_copy

    replicas = join()
    cpu = torch.device("cpu")
    # One process after the other: a process still reads its own copy from the file before it attaches to the
    # shared one (README: not done yet), so loading all at once would peak at N copies, past the cap.
    for turn in range(replicas.size):
        if turn == replicas.rank:
            model = TransformerFile(path, storage="float8", compute_dtype=torch.float32).load(cpu)
            copy = share_host_copy(model, (), replicas, cpu)
        if replicas.size > 1:
            dist.barrier(group=replicas.cpu_group)
    # Read every weight once, as a training step does: a mapped page counts in a process's memory once it has touched
    # it (before, the shared copy's pages are in the memory file but in nobody's page table, so in no Pss).
    checksum = sum(float(p.detach().float().sum()) for p in model.parameters())
    pids = [os.getpid()]
    if replicas.size > 1:
        if copy is not None:
            copy.seal()
        gathered = [None] * replicas.size
        dist.all_gather_object(gathered, os.getpid(), group=replicas.cpu_group)
        pids = gathered
    if replicas.rank == 0:
        workers = {pid: pss_bytes(pid) for pid in pids}
        agent = pss_bytes(os.getppid())  # torchrun's agent
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        Path(out).write_text(json.dumps({"processes": replicas.size, "shared": copy is not None, "checksum": checksum,
                                         "weights_gib": weights / GIB, "workers_pss_gib": sum(workers.values()) / GIB,
                                         "agent_pss_gib": agent / GIB,
                                         "machine_pss_gib": (sum(workers.values()) + agent) / GIB}))
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
                  f"{r['machine_pss_gib']:.2f} GiB = {r['machine_pss_gib'] / one:.2f} x one process")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
