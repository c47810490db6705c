"""The GPU check script's code path, run on the CPU with tiny dims (`gpu_check.py --tiny`), in process
(its `main`; a new process would cost its imports, 5-25 s): the whole life of a run from random model files
on disk (load, cache, then init, train, preview and save for four swap settings), its tables and verdict."""

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
