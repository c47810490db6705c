"""The one device command: every CUDA path of the pack measured at real size within 9 minutes on an H200,
into one JSON and one Markdown report with a final `VERDICT:` line. Run through `benchmarks/device_check.sh`
(which first installs the carried wheels); `--tiny` runs every phase on the CPU in seconds.

    bash benchmarks/device_check.sh             # CUDA; the report goes to $OUT (default benchmarks/device_out)
    bash benchmarks/device_check.sh --tiny      # CPU, tiny dims: the same phases, the same report schema

Phases, each within its share of --seconds (default 480 s; a phase that would overrun is cut and reported):
1. versions  the libraries found (and where from) against requirements.txt's floors and the torch the GPU path
             was written for;
2. memory    gpu_check.run_memory: random-weight files, load, cache, then init / train / preview / save for the
             planner's choice at 24 GiB and at 16 GiB and all resident, measured against the plan per phase;
             one streamed step against the all-resident one (same batches);
3. speed     gpu_speed_check.run_speed: seconds per step against the timeline model for those settings and
             the float8 paths (eager, fp8 activations, compiled), each path's losses against the eager one;
4. profile   gpu_profile.run_profile (benchmarks/gpu_profile.py, where present): the card's clocks, per-kernel
             rates and one profiled step per fused-block variant;
5. nccl      an all-reduce over every GPU when there are more than one (else the report says so).

Every budgeted setting runs under its card's cap (torch.cuda.set_per_process_memory_fraction), with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (device_check.sh; the report's environment records it).
"""

from __future__ import annotations

import gc

gc.disable()  # through the imports below; load_engine turns it on again (trainer_core/runs/startup.py)

import argparse  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from importlib import metadata  # noqa: E402
from pathlib import Path  # noqa: E402

import harness  # noqa: E402
from harness import Report  # noqa: E402

import torch  # noqa: E402

from trainer_core.runs.startup import load_engine  # noqa: E402

load_engine()

REPO = Path(__file__).resolve().parents[1]
LIBRARIES = ("diffusers", "transformers", "peft", "bitsandbytes", "safetensors", "tokenizers", "huggingface_hub")
# The torch this GPU path was written for (the device's): older ones are not claimed (README, install).
TORCH_WRITTEN_FOR = (2, 11)
# Shares of the run's time, in this order; what a phase leaves unused goes to the next. The whole check must fit one
# device call of 8 minutes (--seconds 480): memory's share holds its six settings (8, 12, 16, 24 GiB, all resident) or
# reports the ones cut; profile is benchmarks/gpu_profile.py's (the speed issues'), skipped with a note where absent.
SLICES = {"memory": 0.4, "speed": 0.35, "profile": 0.2}


def floors() -> dict[str, str]:
    """requirements.txt's `name>=version` lines."""
    found = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)", line.strip())
        if m:
            found[m.group(1).lower().replace("-", "_")] = m.group(2)
    return found


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def check_versions(report: Report) -> None:
    rows = report.table("versions", ["library", "version", "floor", "from"])
    need = floors()
    torch_version = version_tuple(torch.__version__)
    rows.append({"library": "torch", "version": torch.__version__, "floor": ".".join(map(str, TORCH_WRITTEN_FOR)),
                 "from": str(Path(torch.__file__).parent.parent)})
    report.check("torch at least the version the GPU path was written for", torch_version[:2] >= TORCH_WRITTEN_FOR,
                 f"torch {torch.__version__}, written for {'.'.join(map(str, TORCH_WRITTEN_FOR))}")
    for name in LIBRARIES:
        try:
            dist = metadata.distribution(name)
            version, where = dist.version, str(dist.locate_file(""))
        except metadata.PackageNotFoundError:
            version, where = None, "missing"
        floor = need.get(name)
        rows.append({"library": name, "version": version, "floor": floor, "from": where})
        if floor is not None:
            report.check(f"{name} at its floor or above", version is not None and version_tuple(version) >= version_tuple(floor),
                         f"{version or 'missing'} (floor {floor}, from {where})")


def nccl_check(report: Report, env: harness.Env) -> None:
    count = torch.cuda.device_count() if env.cuda else 0
    if count < 2:
        report.note(f"NCCL: not run ({'CPU run' if not env.cuda else f'{count} GPU on this machine'}: an all-reduce "
                    "needs two or more)")
        return
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        t = time.perf_counter()
        mp.spawn(_nccl_worker, args=(count, folder), nprocs=count, join=True)
        sums = [float(Path(folder, f"{r}.txt").read_text()) for r in range(count)]
    expected = count * (count + 1) / 2 * 1024 * 1024
    report.check(f"NCCL all-reduce over {count} GPUs", all(s == expected for s in sums),
                 f"sums {sums} (expected {expected:g}) in {time.perf_counter() - t:.1f} s")


def _nccl_worker(rank: int, world: int, folder: str) -> None:
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    x = torch.full((1024, 1024), float(rank + 1), device=f"cuda:{rank}")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    Path(folder, f"{rank}.txt").write_text(str(float(x.sum())))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(parser, os.environ.get("OUT") or str(REPO / "benchmarks" / "device_out"))
    parser.add_argument("--workdir", default=None, help="where the model files go (default: a temporary folder)")
    parser.add_argument("--only", nargs="*", choices=list(SLICES), default=None, help="run only these phases")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (None if args.tiny else 480.0)
    clock = harness.Clock(seconds)
    env = harness.make_env(args, "device_check.py")
    report = Report(f"Device check ({'tiny, CPU' if env.tiny else 'real-size Qwen-Image'})", env,
                    "bash benchmarks/device_check.sh" + (" --tiny" if env.tiny else ""))
    report.environment["python_executable"] = sys.executable
    # device_check.sh sets expandable_segments (a capped, fragmented caching allocator may itself run out of memory)
    report.environment["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    check_versions(report)
    import gpu_check
    import gpu_speed_check

    try:
        import gpu_profile  # benchmarks/gpu_profile.py: the speed issues' profile phase, where it is present
    except ImportError:
        gpu_profile = None
    phases = args.only or list(SLICES)
    for name in phases:
        share = None if seconds is None else SLICES[name] * seconds
        if share is not None:  # what earlier phases left unused goes to this one
            share = max(share, clock.left() - sum(SLICES[n] * seconds for n in phases[phases.index(name) + 1:]))
        print(f"== {name} ({'no limit' if share is None else f'{share:.0f} s'})", flush=True)
        try:
            if name == "memory":
                workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="qwen_device_check_"))
                try:
                    gpu_check.run_memory(env, report, clock, workdir, share)
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
            elif name == "speed":
                gpu_speed_check.run_speed(env, report, clock, share)
            elif gpu_profile is None:
                report.note("profile: not run (benchmarks/gpu_profile.py is not in this checkout)")
            else:
                gpu_profile.run_profile(env, report, clock, share)
        except Exception as e:  # one phase's failure is a result, and the next phase still runs
            import traceback

            traceback.print_exc()
            report.check(f"{name}: ran to its end", False, f"{type(e).__name__}: {e}"[:400])
        harness.release_cached(env)
    nccl_check(report, env)
    return 0 if report.write(args.out, "device_check").startswith("VERDICT: PASS") else 1


if __name__ == "__main__":
    raise SystemExit(main())
