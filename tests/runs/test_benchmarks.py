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


def test_the_synthetic_dataset_is_read_from_memory_and_trains(monkeypatch):
    """benchmarks/common.synthetic_setup (the speed and GPU-speed benchmarks' data): the cache hands back the very
    tensors it put in memory (its keys are the ones `CachedDataset` reads: a file read would fail, there is none),
    in the documented shapes, and the real Trainer trains on them."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import common

    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.families.qwen_image import build_tiny_components
    from trainer_core.training import Trainer

    transformer = build_tiny_components(seed=0, storage="float32").transformer
    cfg = transformer.config
    components, dataset = common.synthetic_setup(transformer, samples=3, latent_hw=(4, 6), text_tokens=5,
                                                 device=torch.device("cpu"), compute_dtype=torch.float32,
                                                 storage="float32")
    assert len(dataset.samples) == 3 and {s.bucket for s in dataset.samples} == {(48, 32)}
    first = dataset.samples[0]
    assert dataset.latents(first.latent_key).shape == (cfg.in_channels // cfg.patch_size ** 2, 4, 6)
    assert dataset.latents(first.latent_key) is dataset._memory[(first.latent_key, "latents")]
    assert dataset.embedding(first.text_key).shape == (5, cfg.joint_attention_dim)
    trainer = Trainer(components, dataset, LoraConfig(rank=2), OptimizerConfig(optimizer="adamw"),
                      TrainConfig(run_name="synthetic", blocks_to_swap=0, gradient_checkpointing=False))
    try:
        losses = trainer.train(2).losses
    finally:
        trainer.close()
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
