"""The one device command, `bash benchmarks/device_check.sh --tiny`, run on the CPU as the GPU machine runs it
(its own process, the report in $OUT): every phase at tiny dims, so the script cannot rot between GPU loans.
Checked: the report's schema (JSON and Markdown), the tables each phase writes, and the verdict line."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

TABLES = {
    "versions": ["library", "version", "floor", "from"],
    "memory per phase": ["setting", "blocks_to_swap", "phase", "gpu_measured", "gpu_planned", "allocated_measured",
                         "allocated_planned", "host_measured", "host_planned", "seconds"],
    "streaming correctness": ["setting", "first_loss", "resident_first_loss", "lora_after_one_step_relative_difference",
                              "bit_for_bit"],
    "seconds per step": ["configuration", "blocks_to_swap", "allocated_measured", "allocated_planned",
                         "planned_over_measured", "reserved_measured", "planned_total", "seconds_per_step",
                         "predicted_seconds_per_step", "pinned_host", "first_loss", "last_loss", "loss_vs_eager", "status"],
    # the profile phase (benchmarks/gpu_profile.py)
    "card": ["query", "value"],
    "kernel rates": ["piece", "shape", "dtype", "variant", "ms", "rate", "note"],
    "profiled steps": ["variant", "blocks", "seconds_per_step", "kernels", "host_syncs", "loss", "top_kernels"],
}


@pytest.mark.slow  # a new process with the whole stack (30-160 s here, most of it imports under load)
def test_device_check_tiny_writes_the_report_and_a_passing_verdict(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable, OMP_NUM_THREADS="1")
    result = subprocess.run(["bash", str(REPO / "benchmarks" / "device_check.sh"), "--tiny"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.rstrip().splitlines()[-1].startswith("VERDICT: PASS")
    assert sorted(p.name for p in out.iterdir()) == ["device_check.json", "device_check.md"]
    report = json.loads((out / "device_check.json").read_text())
    assert set(report) == {"schema", "title", "command", "environment", "tables", "checks", "cut", "skipped", "notes",
                           "seconds", "verdict"}
    assert report["schema"] == 1 and report["verdict"].startswith("VERDICT: PASS")
    assert "PYTORCH_CUDA_ALLOC_CONF" in report["environment"]  # device_check.sh sets it; recorded
    # the profile phase runs where benchmarks/gpu_profile.py exists, and says so where it does not
    assert (REPO / "benchmarks" / "gpu_profile.py").exists() or any("profile: not run" in n for n in report["notes"])
    assert {name: t["columns"] for name, t in report["tables"].items()} == TABLES
    for table in report["tables"].values():
        assert table["rows"] and all(set(r) == set(table["columns"]) or set(r) <= set(table["columns"])
                                     for r in table["rows"])
    memory = report["tables"]["memory per phase"]["rows"]
    # the tiny budget's choices standing for the 8 and 12 GiB cards (gpu_check.TINY_CARDS), the most swapped first
    settings = ["auto for 8 GiB (tiny budget x1) (3 swapped)", "2 swapped", "auto for 12 GiB (tiny budget x1.5) (0 swapped)",
                "all resident"]
    streamed = next(r["setting"] for r in memory if r["setting"].startswith("text encoder streamed"))
    assert streamed.endswith("decoder layers)")
    assert [(r["setting"], r["phase"]) for r in memory] == [("(all)", "load"), ("(all)", "cache"), (streamed, "cache")] + [
        (s, p) for s in settings for p in ("init", "train", "preview", "save")]
    # Streaming on the CPU computes the very values the resident blocks do.
    assert all(r["bit_for_bit"] for r in report["tables"]["streaming correctness"]["rows"])
    speed = [r["configuration"] for r in report["tables"]["seconds per step"]["rows"]]
    assert speed == ["auto (tiny budget) (3 swapped)", "2 swapped", "all resident (eager float8)",
                     "all resident, fp8 activations", "auto (tiny budget) (3 swapped), tail placement",
                     "auto (tiny budget) (3 swapped), LoRA in float32",
                     "auto (tiny budget) (3 swapped), no modulation ahead", "all resident, int8 ConvRot blocks",
                     "all resident, int8 compute", "auto (tiny budget) (3 swapped), int8 compute",
                     "auto (tiny budget) (3 swapped), int8 ConvRot blocks"]
    assert report["cut"] == [] and [s["phase"] for s in report["skipped"]] == ["speed: all resident, compiled float8",
                                                                                   "profile: fused compiled step"]
    assert all(c["ok"] for c in report["checks"]) and len(report["checks"]) > 20
    text = (out / "device_check.md").read_text()
    assert all(f"## {name}" in text for name in TABLES)
    assert text.rstrip().splitlines()[-1] == report["verdict"]


PROFILE_TABLES = {
    "versions": TABLES["versions"],
    "card": ["query", "value"],
    "kernel rates": ["piece", "shape", "dtype", "variant", "ms", "rate", "note"],
    "profiled steps": ["variant", "blocks", "seconds_per_step", "kernels", "host_syncs", "loss", "top_kernels"],
}


@pytest.mark.slow  # a new process with the whole stack (imports dominate)
def test_device_check_profile_tiny(tmp_path):
    """`--only profile` at tiny dims: the card table, every piece's rate, and the diffusers and fused eager steps
    with equal losses (the compiled step is skipped on the CPU)."""
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable, OMP_NUM_THREADS="1")
    result = subprocess.run(["bash", str(REPO / "benchmarks" / "device_check.sh"), "--tiny", "--only", "profile"],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "device_check.json").read_text())
    assert {name: t["columns"] for name, t in report["tables"].items()} == PROFILE_TABLES
    rates = report["tables"]["kernel rates"]["rows"]
    assert {r["piece"] for r in rates} == {"matmul", "float8 upcast", "attention fwd+bwd", "RMSNorm+RoPE fwd+bwd",
                                           "LoRA add"}
    assert all(r["ms"] is not None and r["ms"] > 0 for r in rates)
    steps = report["tables"]["profiled steps"]["rows"]
    assert [r["variant"] for r in steps] == ["diffusers", "fused eager"]
    assert steps[0]["loss"] == steps[1]["loss"] and all(r["kernels"] > 0 for r in steps)
    assert [s["phase"] for s in report["skipped"]] == ["profile: fused compiled step"]
    assert report["verdict"].startswith("VERDICT: PASS")
