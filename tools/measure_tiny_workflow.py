"""Queues the tiny first-run workflow's API twin twice, the way ComfyUI runs it (tests/graph_runner.py), and
prints each queue's seconds, the loss at its first and last step, and how far the preview moved from the
untrained model's (mean absolute change, 0..1 scale). The README's figures come from here.

    OMP_NUM_THREADS=1 python tools/measure_tiny_workflow.py
Writes nothing outside a temporary folder.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tiny_workflow_"))
    for kind in ("MODELS", "LORAS", "OUTPUT"):  # no model files: the workflow must not need any
        os.environ[f"QWEN_LORA_{kind}"] = str(tmp / kind.lower())
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "tools"))
    from build_workflows import load_pack
    from graph_runner import GraphRunner, RecordImages

    pack = load_pack()
    from build_workflows import FIRST_RUN
    prompt = json.loads((REPO / "example_workflows" / "api" / f"{FIRST_RUN}.api.json").read_text())
    runner = GraphRunner(pack.NODE_CLASS_MAPPINGS)
    # The untrained model's preview (the adapter starts at zero): the nodes up to Init Trainer and a Preview.
    before = {k: v for k, v in prompt.items() if k in {"1", "2", "3", "4", "5", "6"}}
    before["8"] = {**prompt["8"], "inputs": {**prompt["8"]["inputs"], "trainer": ["6", 0]}}
    start = time.perf_counter()
    untrained = runner.run(before)["8"][0].float()
    print(f"load, cache, init and an untrained preview: {time.perf_counter() - start:.1f} s")
    for queue in (1, 2):
        RecordImages.received.clear()
        start = time.perf_counter()
        outputs = runner.run(prompt)
        seconds = time.perf_counter() - start
        trainer = outputs["7"][0]
        chunk = [loss for step, loss in trainer.progress.loss_history][-prompt["7"]["inputs"]["steps"]:]
        moved = (outputs["8"][0].float() - untrained).abs().mean().item()  # the Preview as sampled (64 px)
        print(f"queue {queue}: {seconds:.1f} s, step {trainer.step}, loss {chunk[0]:.4f} -> {chunk[-1]:.4f}, "
              f"preview moved {moved:.4f} from the untrained one")


if __name__ == "__main__":
    main()
