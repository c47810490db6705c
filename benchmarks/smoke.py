"""Every benchmark script run once at tiny sizes, one after another in this one process (the libraries are imported
once), so that a refactor which breaks a script fails the test suite (`tests/house/test_benchmarks_smoke.py`)
instead of waiting for the next person who runs it.

    .venv/bin/python benchmarks/smoke.py [SCRIPT ...]   # one JSON line per script: script, ok, seconds, error

`SMOKE` gives each script the arguments of its tiny run; `ELSEWHERE` names the scripts run end to end by another
test (or that are libraries, or need what a smoke run cannot have) and says where or why. The test checks that every
`benchmarks/*.py` is in exactly one of the two. The figures a smoke run prints mean nothing: only that it ran.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent

# script -> its command-line arguments for a run of seconds.
SMOKE: dict[str, list[str]] = {
    "speed.py": ["--smoke"],
    "memory_cpu.py": ["--smoke", "--out", "{tmp}/results_cpu"],
    "caching_time_table.py": ["--smoke"],
    "plan_tables.py": ["--smoke"],
    "timeline_table.py": ["--smoke"],
    "eager_float8_cpu.py": ["output", "--smoke"],
    "int8_cpu.py": ["int8", "1", "--smoke"],
    "cache_encode_alone.py": ["--images", "2", "--side", "16", "--batch", "2", "--runs", "1"],
    "fp8_activations_quality.py": ["--steps", "2", "--tokens", "16", "--smoke"],
    "preview_movement.py": ["--rates", "2e-3", "--steps", "2", "--out", "{tmp}/preview_movement"],
    "compiled_float8_cpu.py": ["eager", "--steps", "1", "--smoke"],
    "transparency21.py": ["--vae-steps", "1", "--vae-batch", "1", "--base-images", "2", "--base-steps", "1",
                          "--steps", "1", "--sample-steps", "1", "--out", "{tmp}/transparency21"],
    "op_count.py": ["--tiny", "--no-compiled"],
    "int8_compute_rates.py": ["--tiny"],
}

# script -> where else it runs, or why it has no smoke run here.
ELSEWHERE: dict[str, str] = {
    "smoke.py": "this driver",
    "common.py": "a library of the other scripts (tests/runs/test_benchmarks.py trains on its synthetic data)",
    "harness.py": "the GPU checks' harness: tests/runs/test_benchmarks.py and test_device_check.py",
    "memory_cap.py": "a library (realsize_cpu.py, host_memory.py)",
    "device_check.py": "tests/runs/test_device_check.py runs `device_check.sh --tiny` (every phase at tiny dims)",
    "gpu_check.py": "a phase of device_check.py (tests/runs/test_device_check.py)",
    "gpu_speed_check.py": "a phase of device_check.py (tests/runs/test_device_check.py)",
    "gpu_profile.py": "the profile phase of device_check.py (tests/runs/test_device_check.py, --tiny)",
    "int8_compute_accuracy.py": "real-width Linears and 100 training steps of the shapes model (tens of minutes on "
                                "2 cores); its pieces are tests/engine/test_int8_compute.py's",
    "device_wheels.py": "`select` runs in device_check.sh --tiny; `prepare` downloads wheels (network)",
    "shape_concept.py": "tests/runs/test_shapes_model.py (2 steps of the demo on the shipped shapes model)",
    "shape_effects.py": "trains the shipped shapes model's run files in full (minutes); shares shape_concept.py's "
                        "training and drawing, which tests/runs/test_shapes_model.py runs",
    "realsize_cpu.py": "writes and trains the 20B-parameter model files (30 GB, hours): never on a shared machine",
    "host_memory.py": "real-width blocks in several processes under a memory cap (GBs): never on a shared machine",
}


def run_one(script: str, args: list[str], tmp: Path) -> dict:
    argv = [str(HERE / script), *(a.replace("{tmp}", str(tmp)) for a in args)]
    saved_argv, started, out = sys.argv, (time.perf_counter(), time.process_time()), io.StringIO()
    error = None
    try:
        sys.argv = argv
        with contextlib.redirect_stdout(out):
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            error = f"exit {stop.code}: {out.getvalue()[-2000:]}"
    except Exception:  # noqa: BLE001  (reported, with its traceback, as this script's failure)
        error = traceback.format_exc()[-4000:]
    finally:
        sys.argv = saved_argv
    return {"script": script, "ok": error is None, "seconds": round(time.perf_counter() - started[0], 2),
            "cpu_seconds": round(time.process_time() - started[1], 2), "error": error}


def main(argv: list[str] | None = None) -> int:
    import tempfile

    names = (argv if argv is not None else sys.argv[1:]) or list(SMOKE)
    unknown = [n for n in names if n not in SMOKE]
    if unknown:
        raise SystemExit(f"no smoke run for {unknown}: choose from {sorted(SMOKE)}")
    sys.path.insert(0, str(HERE))
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            result = run_one(name, SMOKE[name], Path(tmp))
            failed += not result["ok"]
            print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
