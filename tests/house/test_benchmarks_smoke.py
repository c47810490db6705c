"""Every benchmark script runs (benchmarks/smoke.py: each at tiny sizes, in one subprocess), so a refactor that breaks
one fails here; and every script under benchmarks/ has a smoke run or names the test that runs it elsewhere."""

import json
import os
import subprocess
import sys

from conftest import REPO

BENCHMARKS = REPO / "benchmarks"


def _smoke_module():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import smoke
    finally:
        sys.path.remove(str(BENCHMARKS))
    return smoke


def test_every_benchmark_script_has_a_smoke_run_or_says_where_it_runs():
    smoke = _smoke_module()
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    listed = set(smoke.SMOKE) | set(smoke.ELSEWHERE)
    assert not set(smoke.SMOKE) & set(smoke.ELSEWHERE)
    assert scripts - listed == set(), "a new benchmark script: give it a smoke run in benchmarks/smoke.py"
    assert listed - scripts == set(), "benchmarks/smoke.py lists a script that is gone"


def test_every_smoke_run_passes(tmp_path):
    smoke = _smoke_module()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    result = subprocess.run([sys.executable, str(BENCHMARKS / "smoke.py")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=900)
    runs = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"script"')]
    assert [r["script"] for r in runs] == list(smoke.SMOKE), result.stdout[-2000:] + result.stderr[-4000:]
    failed = {r["script"]: r["error"] for r in runs if not r["ok"]}
    assert failed == {} and result.returncode == 0, failed
