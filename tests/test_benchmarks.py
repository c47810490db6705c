"""The GPU checks' one harness (benchmarks/harness.py): the report's verdict from its checks, cut and skipped
phases, and the JSON and Markdown it writes. The checks themselves run end to end in test_device_check.py."""

import json

import torch

from conftest import REPO


def _report(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import harness

    env = harness.Env(tiny=True, device=torch.device("cpu"), steps=2, context_bytes=0, hardware="CPU")
    return harness, harness.Report("title", env, "cmd")


def test_verdict_passes_only_with_checks_and_none_failed(monkeypatch):
    harness, report = _report(monkeypatch)
    assert report.verdict() == "VERDICT: FAIL: no checks ran"
    report.check("a", True, "fine")
    assert report.verdict() == "VERDICT: PASS: all 1 checks"
    report.cut_phase("speed: x", "no time")
    report.skip("speed: y", "no GPU")
    assert report.verdict() == "VERDICT: PASS: all 1 checks; 1 phase(s) cut for time; 1 skipped on this machine"
    report.check("b", False, "broken")
    assert report.verdict().startswith("VERDICT: FAIL: 1 of 2 checks failed: b")


def test_report_writes_json_and_markdown_with_the_verdict_last(monkeypatch, tmp_path, capsys):
    harness, report = _report(monkeypatch)
    rows = report.table("t", ["x", "y"])
    rows.append({"x": 1, "y": 0.5})
    rows.append({"x": 2})
    report.check("a", True, "fine")
    verdict = report.write(tmp_path, "r")
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == verdict == "VERDICT: PASS: all 1 checks"
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["tables"] == {"t": {"columns": ["x", "y"], "rows": [{"x": 1, "y": 0.5}, {"x": 2}]}}
    assert data["checks"] == [{"name": "a", "ok": True, "detail": "fine"}] and data["verdict"] == verdict
    lines = (tmp_path / "r.md").read_text().splitlines()
    assert "| 1 | 0.500 |" in lines and "| 2 | - |" in lines and lines[-1] == verdict


def test_clock_shares_time_and_none_means_no_limit(monkeypatch):
    harness, _ = _report(monkeypatch)
    assert harness.Clock(None).enough(1e9)
    assert not harness.Clock(0.0).enough(1.0)
