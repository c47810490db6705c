"""The one harness of the GPU checks (gpu_check.py, gpu_speed_check.py, device_check.py): their arguments, the
memory readers, the time slices, and the report (rows, checks, cut phases) written as JSON and Markdown with a
final `VERDICT:` line.

Report JSON (schema 1): {"schema", "title", "command", "environment": {...}, "tables": {name: {"columns":
[...], "rows": [{column: value}]}}, "checks": [{"name", "ok", "detail"}], "cut": [{"phase", "reason"}],
"skipped": [{"phase", "reason"}], "notes": [...], "seconds", "verdict"}. A cut phase is no failure: it would
have overrun its time slice and says so; a skipped one cannot run on this machine (the compiled path on a CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import platform
import sys
import threading
import time
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)

import torch

from trainer_core.planner import GIB, MIB

SCHEMA = 1


def add_common_args(parser: argparse.ArgumentParser, out_default: str) -> None:
    parser.add_argument("--tiny", action="store_true", help="tiny dims on the CPU (the same code path, in seconds)")
    parser.add_argument("--out", default=out_default, help="folder for the report (JSON + Markdown)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per setting (default 5, tiny 2)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="time for the whole run; phases that would overrun their share are cut and reported")


@dataclasses.dataclass
class Env:
    """What every measurement needs to know about where it runs."""

    tiny: bool
    device: torch.device
    steps: int
    context_bytes: int  # CUDA context and other memory outside torch's allocator at the start (0 on the CPU)
    hardware: str

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def unit(self) -> tuple[int, str]:
        return (GIB, "GiB") if self.cuda else (MIB, "MiB")


def make_env(args, script: str) -> Env:
    from trainer_core.runs.cli import _quiet_libraries

    _quiet_libraries()
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit(f"{script} needs a CUDA device; run it with --tiny to exercise the code path on a CPU")
    device = torch.device("cpu" if args.tiny else "cuda")
    steps = args.steps or (2 if args.tiny else 5)
    if steps < 2:
        raise SystemExit(f"--steps {steps}: at least 2 (the first step warms up, the others are timed)")
    if device.type == "cuda":
        torch.cuda.init()
        torch.empty(1, device=device)  # the context now exists
        free, total = torch.cuda.mem_get_info(device)
        context = total - free - torch.cuda.memory_reserved(device)
        hardware = f"{torch.cuda.get_device_name(device)}, {total / GIB:.1f} GiB"
    else:
        context, hardware = 0, f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"
    return Env(args.tiny, device, steps, context, hardware)


# --------------------------------------------------------------------------------------------------
# memory readers


def host_now() -> int:
    """Resident anonymous + shared memory of this process (pinned buffers included, file cache not); 0
    where /proc is missing."""
    try:
        fields = {}
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = value
        return sum(int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssShmem") if k in fields)
    except OSError:
        return 0


class HostPeak:
    """Peak of `host_now`, sampled by a thread every 20 ms."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, host_now())
            self._stop.wait(0.02)

    def __enter__(self) -> HostPeak:
        self.peak = host_now()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, host_now())


@dataclasses.dataclass
class Measured:
    gpu_total: int = 0  # max reserved + outside torch's allocator
    gpu_allocated: int = 0
    gpu_outside: int = 0  # of gpu_total: outside torch's allocator (context, cuBLAS)
    host: int = 0
    seconds: float = 0.0


def release_cached(env: Env) -> None:
    """What an earlier measurement dropped, given back, so it is not the next one's."""
    gc.collect()
    if env.cuda:
        torch.cuda.synchronize(env.device)
        torch.cuda.empty_cache()
        if hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()  # pinned blocks cached by torch


@contextlib.contextmanager
def card_of(env: Env, budget: int | None):
    """On a GPU, torch's allocator held to a card of `budget` bytes (the CUDA context outside it): past it the allocator
    frees its cache and retries, then raises out of memory, as on that card, and the sampler's choice of a tiled decode
    (`planner.device.room_now`) reads the same cap. (The first device check ran its 16 and 24 GiB settings on an
    80 GB H100 uncapped: the preview decoded whole and the cache kept 21.5 GiB reserved for 14.7 allocated.)"""
    if not env.cuda or budget is None:
        yield
        return
    total = torch.cuda.get_device_properties(env.device).total_memory
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, (budget - env.context_bytes) / total), env.device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, env.device)


@contextlib.contextmanager
def phase(env: Env):
    """Measure the body as one phase: peak statistics reset at its start, read at its end."""
    if env.cuda:
        release_cached(env)
        torch.cuda.reset_peak_memory_stats(env.device)
    result = Measured()
    started = time.perf_counter()
    with HostPeak() as host:
        yield result
        if env.cuda:
            torch.cuda.synchronize(env.device)
    result.seconds = time.perf_counter() - started
    result.host = host.peak
    if env.cuda:
        free, total = torch.cuda.mem_get_info(env.device)
        outside = total - free - torch.cuda.memory_reserved(env.device)
        result.gpu_total = torch.cuda.max_memory_reserved(env.device) + outside
        result.gpu_outside = outside
        result.gpu_allocated = torch.cuda.max_memory_allocated(env.device)


def pinned_bytes(env: Env) -> int:
    if not env.cuda:
        return 0
    stats = torch.cuda.host_memory_stats()
    return int(stats.get("allocated_bytes.current", stats.get("allocated_bytes.all.current", 0)))


def timed_steps(env: Env, trainer, steps: int):
    """One warm-up step (kernels, compilation, optimizer state), then steps - 1 timed: (reports, s/step)."""
    first = trainer.train(1)
    if env.cuda:
        torch.cuda.synchronize(env.device)
    t = time.perf_counter()
    rest = trainer.train(steps - 1)
    if env.cuda:
        torch.cuda.synchronize(env.device)
    return first, rest, (time.perf_counter() - t) / (steps - 1)


# --------------------------------------------------------------------------------------------------
# time slices


class Clock:
    """The run's time, shared out as slices: a phase starts only when its slice's share is left, and its
    loop asks `enough(seconds)` before each further item. None: no limit."""

    def __init__(self, seconds: float | None):
        self.started = time.perf_counter()
        self.end = None if seconds is None else self.started + seconds

    def left(self) -> float:
        return float("inf") if self.end is None else self.end - time.perf_counter()

    def enough(self, seconds: float) -> bool:
        return self.left() >= seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


# --------------------------------------------------------------------------------------------------
# the report


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    detail: str


class Report:
    def __init__(self, title: str, env: Env, command: str):
        self.title, self.env, self.command = title, env, command
        self.started = time.perf_counter()
        self.tables: dict[str, dict] = {}
        self.checks: list[Check] = []
        self.cut: list[dict] = []
        self.skipped: list[dict] = []
        self.notes: list[str] = []
        self.environment = {"hardware": env.hardware, "device": env.device.type, "python": sys.version.split()[0],
                            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
                            "cuda_context_mib": round(env.context_bytes / MIB, 1)}

    def table(self, name: str, columns: list[str]) -> list[dict]:
        """The rows of table `name` (created with these columns), to append dicts to."""
        if name not in self.tables:
            self.tables[name] = {"columns": columns, "rows": []}
        return self.tables[name]["rows"]

    def check(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        print(f"  check {'ok' if ok else 'FAILED'}: {name}: {detail}", flush=True)
        return bool(ok)

    def cut_phase(self, phase: str, reason: str) -> None:
        self.cut.append({"phase": phase, "reason": reason})
        print(f"  cut: {phase}: {reason}", flush=True)

    def skip(self, phase: str, reason: str) -> None:
        self.skipped.append({"phase": phase, "reason": reason})
        print(f"  skipped: {phase}: {reason}", flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  {text}", flush=True)

    def verdict(self) -> str:
        failed = [c.name for c in self.checks if not c.ok]
        cut = (f"; {len(self.cut)} phase(s) cut for time" if self.cut else "") + \
            (f"; {len(self.skipped)} skipped on this machine" if self.skipped else "")
        if not self.checks:
            return "VERDICT: FAIL: no checks ran" + cut
        if failed:
            return f"VERDICT: FAIL: {len(failed)} of {len(self.checks)} checks failed: {'; '.join(failed)}{cut}"
        return f"VERDICT: PASS: all {len(self.checks)} checks{cut}"

    def as_json(self) -> dict:
        return {"schema": SCHEMA, "title": self.title, "command": self.command, "environment": self.environment,
                "tables": self.tables, "checks": [dataclasses.asdict(c) for c in self.checks], "cut": self.cut,
                "skipped": self.skipped, "notes": self.notes, "seconds": round(time.perf_counter() - self.started, 1),
                "verdict": self.verdict()}

    def markdown(self) -> str:
        data = self.as_json()
        env = ", ".join(f"{k} {v}" for k, v in data["environment"].items())
        lines = [f"# {self.title}", "", f"`{self.command}`: {env}.", ""]
        for name, table in self.tables.items():
            lines += [f"## {name}", "", "| " + " | ".join(table["columns"]) + " |",
                      "| " + " | ".join("---" for _ in table["columns"]) + " |"]
            lines += ["| " + " | ".join(_cell(row.get(c)) for c in table["columns"]) + " |" for row in table["rows"]]
            lines.append("")
        lines += ["## checks", "", "| check | result | detail |", "| --- | --- | --- |"]
        lines += [f"| {c.name} | {'ok' if c.ok else 'FAILED'} | {c.detail} |" for c in self.checks]
        lines.append("")
        if self.cut:
            lines += ["Cut for time: " + "; ".join(f"{c['phase']} ({c['reason']})" for c in self.cut), ""]
        if self.skipped:
            lines += ["Skipped on this machine: " + "; ".join(f"{c['phase']} ({c['reason']})" for c in self.skipped), ""]
        lines += [f"- {n}" for n in self.notes] + ([""] if self.notes else [])
        lines += [f"Total time {data['seconds']:.0f} s.", data["verdict"]]
        return "\n".join(lines) + "\n"

    def write(self, folder: str | Path, stem: str) -> str:
        """`stem`.json and `stem`.md in `folder`; prints and returns the verdict line (the last output line)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stem}.json").write_text(json.dumps(self.as_json(), indent=1) + "\n")
        (folder / f"{stem}.md").write_text(self.markdown())
        print(f"wrote {folder / stem}.json and .md")
        verdict = self.verdict()
        print(verdict, flush=True)
        return verdict


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def gib(n: int | float, env: Env) -> float:
    """Bytes in the report's unit (GiB on a GPU, MiB on the CPU's tiny run), rounded for the tables."""
    return round(n / env.unit[0], 3)
