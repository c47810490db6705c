"""The GPU check script's code path, run on the CPU with tiny dims (`gpu_check.py --tiny`), in process
(its `main`; a new process would cost its imports, 5-25 s)."""

import re

from conftest import REPO


def test_gpu_check_runs_tiny_on_cpu(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # where the script finds its `common` module
    import gpu_check

    out = tmp_path / "gpu_check.md"
    gpu_check.main(["--tiny", "--out", str(out)])
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| configuration", "| ---"))]
    assert [r[0].strip() for r in rows] == ["no swapping", "1 swapped", "2 swapped", "auto (tiny budget)",
                                            "auto (tiny budget), tail placement", "auto (tiny budget), LoRA in fp32"]
    # The variants (another placement, peft's own fp32 LoRA compute) train the same weights here (fp32 compute).
    assert len({r[9] for r in rows}) == 1
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
