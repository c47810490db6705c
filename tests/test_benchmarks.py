"""The GPU check scripts' code paths, run on the CPU with tiny dims (`--tiny`), in process (their `main`; a new
process would cost its imports, 5-25 s): gpu_check.py, the whole life of a run from random model files on disk
(load, cache, then init, train, preview and save for four swap settings), its tables and verdict; and
gpu_speed_check.py, predicted against measured seconds per step for each streaming configuration."""

import re

from conftest import REPO


def test_gpu_check_runs_the_whole_lifecycle_tiny_on_cpu(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # where the script finds its `common` module
    import gpu_check

    out = tmp_path / "gpu_check.md"
    assert gpu_check.main(["--tiny", "--out", str(out), "--workdir", str(tmp_path / "work")]) == 0
    text = out.read_text()
    assert not (tmp_path / "work").exists()  # the files are removed unless --keep-files
    tables = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| ")
              and not line.startswith(("| configuration", "| check", "| ---"))]
    phases = [(r[0].strip(), r[1].strip()) for r in tables if len(r) == 8]
    settings = ["auto (tiny budget) (3 swapped)", "2 swapped", "1 swapped", "no swapping"]
    assert phases == [("(all)", "load"), ("(all)", "cache")] + [
        (s, p) for s in settings for p in ("init", "train", "preview", "save")]
    checks = {r[0].strip(): r[1].strip() for r in tables if len(r) == 3}
    assert set(checks.values()) == {"ok"}
    assert {"first loss equal for every swap setting", "same LoRA for every swap setting"} <= set(checks)
    assert sum(name.endswith("LoRA file") for name in checks) == 4
    assert text.rstrip().splitlines()[-1] == f"VERDICT: PASS: all {len(checks)} checks"


def test_gpu_speed_check_runs_tiny_on_cpu(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # where the script finds its `common` module
    import gpu_speed_check

    out = tmp_path / "gpu_check.md"
    gpu_speed_check.main(["--tiny", "--out", str(out)])
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| configuration", "| ---"))]
    assert [r[0].strip() for r in rows] == ["no swapping", "1 swapped", "2 swapped", "auto (tiny budget)",
                                            "auto (tiny budget), tail placement", "auto (tiny budget), LoRA in fp32",
                                            "auto (tiny budget), no modulation ahead",
                                            "auto (tiny budget), fp8 activations"]
    # The variants (another placement, peft's own fp32 LoRA compute, no modulation ahead) train the same weights
    # here (fp32 compute); fp8 activations change the forward's values a little.
    assert len({r[9] for r in rows[:-1]}) == 1
    assert "max relative difference" in out.read_text()
    rows = rows[:4]
    swaps = [int(r[1]) for r in rows]
    measured = [float(r[2]) for r in rows]
    planned_over_measured = [float(r[4]) for r in rows]
    losses = [r[9].strip() for r in rows]
    # The auto budget is the plan at 3 blocks: fewer (0, 1, 2) plan more, since up to 2 GPU slots hold swapped
    # weights (one per swapped block).
    assert swaps == [0, 1, 2, 3]
    assert measured[0] == measured[1] == measured[2] > measured[3]
    assert all(1.0 <= r <= 1.05 for r in planned_over_measured)  # the plan is on the safe side, and close
    assert len(set(losses)) == 1 and re.fullmatch(r"[\d.]+, [\d.]+", losses[0])  # swapping changes no result
