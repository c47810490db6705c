"""Shared fixtures: tiny real models, the demo dataset, and the pack loaded the way ComfyUI loads it."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path

# The suite's settings for its time on a busy 2-core machine (what each saved, measured: benchmarks/README.md, "The
# test suite's time"). Set before torch is imported; a caller's own setting wins; new processes inherit them.
# One OpenMP thread per process: tiny models gain nothing from more, and on a busy machine OpenMP's waiting threads
# make them several times slower; each of `make test`'s two pytest-xdist workers loads this file, so the two use one
# core each.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Inductor (the compiled float8 path on the CPU) takes /proc/cpuinfo's SIMD list as it is instead of building a test
# program per ISA: the tests check our expressions, not the toolchain (a compiler that cannot build for an ISA still
# fails, loudly, in the kernel's own build).
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
# Inductor compiles these few small kernels in the test's own process, not in a pool of new processes.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
# The tests live in rooms by what they test (house rules, engine, planner, families, captions, canvas, runs,
# robustness, host); this folder holds what they share (this file, graph_runner.py, host_standin.py, int8_files.py,
# data/). A test may import another room's test module for its helpers and fixtures (`from test_headless import
# tiny_run_file`), and a family defined in the test tree registers by module name (house/toy_family): every room is
# on the import path.
ROOMS = ("house", "engine", "planner", "families", "captions", "canvas", "runs", "robustness", "host")
for _room in ROOMS:
    if str(TESTS / _room) not in sys.path:
        sys.path.insert(0, str(TESTS / _room))
sys.path.insert(0, str(REPO / "tools"))
from pack_import import load_pack  # noqa: E402  (the pack imported as ComfyUI imports it: one definition, tools')

# The example workflows by what they are for. Their file names are their titles in ComfyUI's template browser
# (tools/build_workflows.py writes them; tests/canvas/test_workflows.py checks this table against it).
WORKFLOW_STEMS = {
    "first_run": "1 First run - learn a star on a CPU",
    "main": "2 Qwen-Image LoRA - your images",
    "edit": "3 Qwen-Image-Edit LoRA - pairs",
    "qwen21": "4 Qwen-Image 2.1 LoRA - your images",
    "layered": "5 Qwen-Image-Layered LoRA - RGBA",
    "regularized": "6 First run with a regularisation set",
    "captioned": "7 Qwen-Image LoRA - captions first",
    "graph_images": "8 Images from the graph - CPU",
}


def ui_workflow(role: str) -> Path:
    return REPO / "example_workflows" / f"{WORKFLOW_STEMS[role]}.json"


def api_workflow(role: str) -> Path:
    return REPO / "example_workflows" / "api" / f"{WORKFLOW_STEMS[role]}.api.json"

logging.getLogger("diffusers").setLevel(logging.ERROR)
logging.getLogger("transformers").setLevel(logging.ERROR)


def pytest_configure(config):
    """Import the libraries nearly every test uses, then move everything alive to gc's permanent generation
    (`runs.startup.load_engine`, as a training process does).

    The engine collects garbage whenever it releases a model (core/host_memory.give_back_freed_memory), and a
    full collection walks every tracked object: ~0.47 s with these libraries imported (~490k objects), paid
    several times per test. Frozen, the import-time objects (modules, functions, classes: never freed anyway)
    are skipped; what tests create is still collected. Not in pytest-xdist's controller, which runs no test
    and starts its workers only after this hook: the imports there delayed every worker by their ~5 s."""
    # pytest-xdist's controller (which collects nothing) hands out the files in the workers' collection order
    # (pytest_collection_modifyitems: longest first), not its default of the files with the most tests first.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # the controller

    from trainer_core.runs.startup import load_engine

    load_engine()


# The longest test files, run first: pytest-xdist's --dist loadfile gives each worker whole files and by default hands
# out the files with the most tests first, so the few long files of one or two tests (a torchrun launch, a new
# process, Inductor's compiles) came last while the other worker had nothing left. Longest first, the short files fill
# the end (each file's seconds: benchmarks/README.md, "The test suite's time"). A file not listed keeps its place in
# the collection order, after these.
LONGEST_FILES = (
    "test_float8_compiled.py",
    "test_shapes_model.py",
    "test_benchmarks_smoke.py",
    "test_distributed.py",
    "test_distributed_kill.py",
    "test_device_check.py",
    "test_resume.py",
    "test_bad_disk.py",
    "test_trainer.py",
    "test_nodes.py",
    "test_bad_inputs.py",
    "test_memory.py",
    "test_headless.py",
    "test_optimizers.py",
    "test_modulation_ahead.py",
    "test_runs.py",
    "test_phases.py",
)


def pytest_collection_modifyitems(session, config, items):
    """Longest files first (LONGEST_FILES); the tests of a file stay together and in their order."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="module", autouse=True)
def frozen_before_each_module():
    """What is alive when a test file starts, moved to gc's permanent generation (as pytest_configure does
    with the libraries). Tests import more as they go (pipelines, Dynamo, other test modules at collection),
    and session fixtures stay: a worker tracked ~100k objects by mid-run, and every model released collects
    them all (~40 ms, several times per test). Collected first, so only what is alive is frozen; what a
    file's tests create is collected as before."""
    import gc

    gc.collect()
    gc.freeze()
    yield


def pack_module(pack, dotted: str):
    """A submodule of the pack as ComfyUI imported it (distinct from a top-level `trainer_core` import)."""
    return importlib.import_module(f"{pack.__name__}.{dotted}")


@pytest.fixture(scope="session")
def pack():
    return load_pack()


@pytest.fixture
def tiny():
    """Fresh tiny components (fp32 storage) for a test that mutates the model."""
    from trainer_core.families.qwen_image import build_tiny_components

    return build_tiny_components(seed=0, storage="float32")


@pytest.fixture(scope="session")
def demo_folder(tmp_path_factory):
    from trainer_core.runs.demo import make_demo_dataset

    return make_demo_dataset(tmp_path_factory.mktemp("demo_dataset"))


def tiny_dataset_config(folder, **overrides):
    from trainer_core.core.config import DatasetConfig

    settings = dict(folder=str(folder), resolution=64, min_bucket_side=32, max_bucket_side=128)
    settings.update(overrides)
    return DatasetConfig(**settings)


def cached_demo(components, folder, cache_dir, **cache_kwargs):
    """Discover + cache the demo dataset for `components`."""
    from trainer_core.data.cache import build_cache
    from trainer_core.data.images import discover

    return build_cache(components, discover(tiny_dataset_config(folder)), cache_dir, **cache_kwargs)


def adapter_snapshot(trainer) -> dict[str, torch.Tensor]:
    """Copies of every LoRA tensor, keyed by parameter name."""
    return {n: p.detach().clone() for n, p in trainer.built.transformer.named_parameters() if ".lora_" in n}


@pytest.fixture(scope="session")
def tiny_files(tmp_path_factory):
    """The tiny model (seed 0) written by `export-tiny` as ComfyUI single files: name -> path."""
    from trainer_core.families import get_family

    return get_family("qwen-image").export_tiny(tmp_path_factory.mktemp("tiny_files"), layout="comfyui", seed=0)


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """One latent + prompt cache folder for tests on the seed-0 tiny model: entries are content-addressed,
    so tests share them and encode the demo dataset only once."""
    return tmp_path_factory.mktemp("tiny_cache")


@pytest.fixture(scope="session")
def trained_lora(tiny_cache, demo_folder):
    """A trainer after 4 steps of rank 4, alpha 6 on "all" targets (alpha != rank: the scale must survive
    every trip through a file). Read it, do not train it further."""
    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.families.qwen_image import build_tiny_components
    from trainer_core.training import Trainer

    components = build_tiny_components(storage="float32")
    cached = cached_demo(components, demo_folder, tiny_cache)
    trainer = Trainer(components, cached, LoraConfig(rank=4, alpha=6.0, targets="all"),
                      OptimizerConfig(learning_rate=5e-3), TrainConfig(run_name="fmt"))
    trainer.train(4)
    return trainer


def first_call(module: torch.nn.Module, run):
    """(run()'s result, the keyword arguments of `module`'s first forward while it ran): what a pipeline or a training
    step hands the transformer, for the oracle tests that compare the two."""
    seen = []
    handle = module.register_forward_pre_hook(lambda _module, _args, kwargs: seen.append(kwargs), with_kwargs=True)
    try:
        result = run()
    finally:
        handle.remove()
    return result, seen[0]


def one_step_loss(components, cached, run_name: str, lora=None, **train) -> float:
    """The loss of the first step of a new Trainer on `cached` (seed 7, AdamW, every block resident, no
    checkpointing; `train` overrides TrainConfig's fields), closed after. The adapter starts as a no-op, so this is
    the base model's loss, which the oracle tests rebuild from the pinned pipelines' own pieces."""
    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.training import Trainer

    settings = dict(run_name=run_name, seed=7, blocks_to_swap=0, gradient_checkpointing=False, **train)
    trainer = Trainer(components, cached, lora or LoraConfig(rank=4), OptimizerConfig(optimizer="adamw"),
                      TrainConfig(**settings))
    try:
        return trainer.train(1).losses[0]
    finally:
        trainer.close()


# The plan's terms that live while one training forward + backward runs (what `LiveBytes` measures around it).
TRAINING_STEP_TERMS = ("LoRA gradients", "block inputs", "saved activations", "one block's", "backward working",
                       "largest weight", "activations outside")


def measured_step_peak(model, grid: int, text: int, checkpointing: bool, blocks_to_swap: int = 3,
                       int8_compute: bool = False) -> int:
    """`LiveBytes`' peak of one training forward + backward of `model` (a narrow Qwen-Image transformer with a LoRA)
    through `BlockRunner` on the CPU: one bf16 sample of `grid` x `grid` packed latent tokens and `text` prompt tokens,
    seeded; what `planned_step_peak` predicts. `int8_compute`: its block Linears through int8 compute (held in int8
    already: models.int8_compute.store_int8)."""
    from trainer_core.devtools.memprobe import LiveBytes
    from trainer_core.streaming.runner import BlockRunner
    from trainer_core.training.objective import flow_loss

    runner = BlockRunner(model, torch.device("cpu"), blocks_to_swap=blocks_to_swap, checkpointing=checkpointing,
                         int8_compute=int8_compute)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, grid * grid, 64, generator=g).bfloat16()  # (B, packed latent tokens, 4 x 16 channels)
    prompt = torch.randn(1, text, 3584, generator=g).bfloat16()  # (B, text tokens, joint dim)
    target = torch.randn(1, grid * grid, 64, generator=g)
    with LiveBytes() as live:
        prediction = model(hidden_states=x, encoder_hidden_states=prompt, timestep=torch.tensor([0.5]).bfloat16(),
                           img_shapes=[[(1, grid, grid)]], return_dict=False)[0]
        flow_loss(prediction, target).backward()
        del prediction
    runner.uninstall()
    return live.peak


def planned_step_peak(model, grid: int, text: int, checkpointing: bool, blocks_to_swap: int = 3,
                      storage: str = "float8", int8_compute: bool = False) -> int:
    """The plan's peak of one step of peft's own fp32 LoRA compute (no Trainer) on `model`, a latent grid of
    `grid` x `grid` tokens and `text` prompt tokens on the CPU: the figure the probes compare with `LiveBytes`."""
    from trainer_core.planner import PlanInputs, plan_memory
    from trainer_core.planner.arch import arch_from_transformer

    plan = plan_memory(PlanInputs(width=grid * 16, height=grid * 16, text_tokens=text, rank=4, device="cpu",
                                  checkpointing=checkpointing, blocks_to_swap=blocks_to_swap,
                                  lora_in_compute_dtype=False, storage=storage, int8_compute=int8_compute),
                       arch_from_transformer(model))
    return sum(plan.term(n) for n in TRAINING_STEP_TERMS)

