"""Run in a fresh process by test_resume.py: train a tiny trainer to a total step count, optionally
resuming from the run's checkpoint first, and write its adapter tensors (exact fp32) to a file.

    python tests/engine/resume_worker.py DATA WORK TOTAL_STEPS fresh|resume OUT [-- ARGS...]

With `-- ARGS`, the same process then runs `python -m trainer_core ARGS` (its `__main__`), so that one
new process (whose imports are most of its cost) checks both resumes. `main` is also called in process.
"""

import sys
from pathlib import Path

from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: conftest

from trainer_core.runs.startup import load_engine  # noqa: E402

load_engine()  # the imports, as a training process makes them (the `-- ARGS` command's own call finds them made)

from conftest import cached_demo  # noqa: E402
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig  # noqa: E402
from trainer_core.families.qwen_image import build_tiny_components  # noqa: E402
from trainer_core.training import Trainer  # noqa: E402


def main(data: str, work: str, total_steps: int, resume: bool, out: str, cache: str | None = None) -> None:
    """`cache`: the latent + prompt cache folder (default WORK/cache), so that runs in one test can share one."""
    components = build_tiny_components(seed=0, storage="float8")
    cached = cached_demo(components, data, Path(cache) if cache else Path(work) / "cache")
    trainer = Trainer(
        components, cached,
        LoraConfig(rank=4, alpha=8.0, targets="all", dropout=0.1),
        OptimizerConfig(optimizer="adamw8bit", learning_rate=1e-3, warmup_steps=2, schedule="cosine", schedule_steps=10),
        TrainConfig(seed=7, micro_batch_size=2, grad_accum_steps=2, caption_dropout=0.25, blocks_to_swap=1,
                    checkpoint_every=0),
        run_dir=Path(work) / "run",
    )
    if resume:
        assert trainer.resume(), "expected a checkpoint"
    trainer.train(total_steps - trainer.step)
    save_file({n: p.detach().contiguous() for n, p in zip(trainer.built.param_names, trainer.built.params)}, out)
    print("step", trainer.step)
    trainer.close()  # unlock the run folder: the new process resumes it next


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "resume", sys.argv[5])
    if "--" in sys.argv:
        import runpy

        sys.argv = ["python -m trainer_core", *sys.argv[sys.argv.index("--") + 1:]]
        runpy.run_module("trainer_core", run_name="__main__", alter_sys=True)  # exits with the CLI's code
