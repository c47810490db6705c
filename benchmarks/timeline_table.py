"""The timeline model's predictions for benchmarks/README.md: every GPU profile at 24/16/12/8 GiB, 1024², rank 32.

    .venv/bin/python benchmarks/timeline_table.py            # markdown table on stdout (~10 s)

Per budget the memory planner's auto choice (the fewest streamed blocks that fit), then for each compute path the
predicted seconds per step and the streaming overhead over the same step with every block resident; and the
bytes one step copies host-to-device (the mean over a modulation window). Also, for the A/Bs: the trainer's path
without modulation ahead (every forward copies whole blocks), and the same swap counts with the old placement
(the last k blocks). Prediction, not measurement: see the assumptions in
`trainer_core/planner/timeline.py`.
"""

from __future__ import annotations

import dataclasses

import common  # noqa: F401  (puts the repository on sys.path)

from trainer_core.planner import GIB, PlanInputs, auto_blocks_to_swap
from trainer_core.planner.arch import real_arch
from trainer_core.planner.timeline import GPUS, PATHS, RUNTIME, predict
from trainer_core.streaming.placement import tail_placement

BUDGETS = (24, 16, 12, 8)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the first row only (benchmarks/smoke.py: that it runs)")
    smoke = parser.parse_args().smoke
    arch = real_arch()
    inputs = PlanInputs(width=1024, height=1024, rank=32)
    heads = " | ".join(f"{p.label}{' (trainer)' if p == RUNTIME else ''}" for p in PATHS)
    print(f"| GPU | budget | streamed | GB copied / step | {heads} | trainer path, no modulation ahead | "
          "last-k tail, trainer path |")
    print("| --- | --- | --- | --- | " + " | ".join("---" for _ in PATHS) + " | --- | --- |")
    for gpu in list(GPUS.values())[:1] if smoke else GPUS.values():
        for budget in BUDGETS[:1] if smoke else BUDGETS:
            choice = auto_blocks_to_swap(inputs, budget * GIB, arch)
            k = choice.blocks_to_swap
            p = dataclasses.replace(inputs, blocks_to_swap=k)
            preds = [predict(p, gpu, arch=arch, path=path) for path in PATHS]
            tail = predict(p, gpu, tail_placement(arch.num_blocks, k) if k else None, arch, RUNTIME) if k else preds[1]
            plain = predict(dataclasses.replace(p, modulation_ahead=False), gpu, arch=arch, path=RUNTIME)
            cells = " | ".join(f"{pr.seconds:.2f} s ({pr.overhead:+.1%})" for pr in [*preds, plain, tail])
            print(f"| {gpu.name} | {budget} GiB | {k} | {preds[1].copy_bytes / 1e9:.1f} | {cells} |")


if __name__ == "__main__":
    main()
