"""GPU check of the memory plan, phase by phase, over the whole life of a real-size Qwen-Image run.

    python benchmarks/gpu_check.py [--out benchmarks/gpu_check_results.md] [--workdir DIR]   # CUDA, <= 8 min (H200)
    python benchmarks/gpu_check.py --tiny                                                    # CPU, tiny dims

1. files   Real-layout model files with random weights, written tensor by tensor to --workdir
           (`devtools.random_files`): the transformer as ComfyUI's fp8_e4m3fn file (19 GiB), the text
           encoder as its fp8_scaled file (the language model: 7.1 GiB), the VAE (bf16), a tokenizer folder
           (the tiny tokenizer: its token ids all have rows in the real embedding table) and 4 random images
           of 1024 x 1024 with captions. About 27 GiB of disk; removed at the end unless --keep-files.
2. load    The Load node's call (`load_models`, the one place to change when loading changes).
3. cache   `build_cache`: the images' latents, their captions, a preview prompt and the negative prompt.
4. Per swap setting, the planner's choice for --budget-gb first (the most swapped blocks), then 16, 8 and 0:
   init    a `Trainer` (rank 32, attention+mlp, fp32 LoRA, AdamW8bit, checkpointing, the swap count given);
   train   --steps steps;
   preview `sample_image` at 1024 x 1024, CFG 4, 2 sampling steps;
   save    `save_lora` (bf16, ComfyUI's layout), read back; then the trainer is closed.

Measured per phase, after emptying torch's cache and resetting its peak statistics at the phase's start:
GPU = max_memory_reserved + the memory outside torch's allocator at the phase's end (CUDA context, cuBLAS);
max_memory_allocated; host RAM = the peak of the process's resident anonymous + shared memory (pinned memory
included, the OS's file cache not), sampled every 20 ms. Planned: `planner.plan_phases` for the run as built
(its largest bucket and longest caption, the text encoder precision used), with the CUDA context measured at
the start instead of the assumed 0.5 GiB. The process baseline the planner assumes (1 GiB) stays in its
host figures; the one measured after the imports is printed beside them.

Checks (each a row of the last table; the script ends with one line `VERDICT: PASS` or `VERDICT: FAIL ...`
and exits 1 on a failure):
- every phase's measured GPU and host RAM within the plan (the plan must be on the safe side);
- the training phase's plan within 15% of the measurement (allocated bytes: the plan must also be useful);
- the run chosen for --budget-gb stays within that budget in every phase;
- the first step's loss and the trained LoRA (its A matrices in three blocks, within 1%) are the same for
  every swap setting (one LoRA init, whatever device a block is on);
- the saved LoRA reads back with every adapted module; the preview is finite and of the size asked.
On the CPU (--tiny) the device is the host: the GPU columns are empty but for the training phase's device
bytes (the model's resident tensors + the steps' peak of new ones, `memprobe.LiveBytes`), checked against
the plan's training terms within 5%; host RAM is reported but not checked (a tiny model's bytes drown in
the process's own); the other checks run as on the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import math
import platform
import shutil
import tempfile
import threading
import time
from pathlib import Path

import common  # puts the repository on sys.path; resident_bytes

import torch

from trainer_core.planner import GIB, MIB

SIDE_REAL, SIDE_TINY = 1024, 128
IMAGES = 4
PREVIEW_STEPS = 2
CAPTION = ("a photograph of a red bicycle leaning against a weathered stone wall in a quiet village street, warm "
           "afternoon light, long shadows, potted geraniums on the window sills, a cat asleep on the doorstep, "
           "cobblestones wet from an earlier rain, a bakery sign in the distance, soft clouds over the roof tiles")


# --------------------------------------------------------------------------------------------------
# measuring


class HostPeak:
    """Peak resident anonymous + shared memory of this process (pinned buffers included, file cache not),
    sampled by a thread every 20 ms; 0 where /proc is missing."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def now() -> int:
        try:
            fields = {}
            with open("/proc/self/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    fields[key] = value
            return sum(int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssShmem") if k in fields)
        except OSError:
            return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            self._stop.wait(0.02)

    def __enter__(self) -> HostPeak:
        self.peak = self.now()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


@dataclasses.dataclass
class Measured:
    gpu_total: int = 0  # max reserved + outside torch's allocator
    gpu_allocated: int = 0
    gpu_outside: int = 0  # of gpu_total: outside torch's allocator (context, cuBLAS)
    host: int = 0
    seconds: float = 0.0


@contextlib.contextmanager
def phase(cuda: bool, device: torch.device):
    """Measure the body as one phase (see the module docstring)."""
    if cuda:
        gc.collect()  # what an earlier phase dropped in reference cycles (0.4 s: not for the CPU's tiny run)
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()  # at the phase's start: what an earlier phase freed is not this phase's
        torch.cuda.reset_peak_memory_stats(device)
    result = Measured()
    started = time.perf_counter()
    with HostPeak() as host:
        yield result
        if cuda:
            torch.cuda.synchronize(device)
    result.seconds = time.perf_counter() - started
    result.host = host.peak
    if cuda:
        free, total = torch.cuda.mem_get_info(device)
        outside = total - free - torch.cuda.memory_reserved(device)
        result.gpu_total = torch.cuda.max_memory_reserved(device) + outside
        result.gpu_outside = outside
        result.gpu_allocated = torch.cuda.max_memory_allocated(device)


# --------------------------------------------------------------------------------------------------
# the run


def write_files(workdir: Path, tiny: bool, device: torch.device) -> dict[str, Path]:
    """Model files, a tokenizer folder and a dataset folder in --workdir (see the module docstring)."""
    import numpy as np
    from PIL import Image

    from trainer_core.devtools.random_files import write_random_text_encoder, write_random_transformer, write_vae
    from trainer_core.models.tiny import SPECIAL_TOKENS, TINY_TRANSFORMER, TINY_VAE, build_tiny_tokenizer, tiny_text_config

    tokenizer = build_tiny_tokenizer()
    special = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    configs = (dict(TINY_TRANSFORMER, num_layers=4), tiny_text_config(len(tokenizer), special), TINY_VAE) if tiny \
        else (None, None, None)
    files = {
        "transformer": write_random_transformer(workdir / "diffusion_models" / "qwen_image_fp8_e4m3fn.safetensors",
                                                configs[0], device, seed=0),
        "text_encoder": write_random_text_encoder(workdir / "text_encoders" / "qwen_2.5_vl_7b_fp8_scaled.safetensors",
                                                  configs[1], device, seed=1),
        "vae": write_vae(workdir / "vae" / "qwen_image_vae.safetensors", configs[2], device, seed=2),
    }
    tokenizer.save_pretrained(str(workdir / "text_encoders" / "tokenizer"))  # beside the text encoder file
    side = SIDE_TINY if tiny else SIDE_REAL
    images = workdir / "dataset"
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(IMAGES):
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(images / f"{i}.png")
        # Tiny: a short caption, so image tokens outnumber text tokens as at the real size (256 vs ~50 here,
        # 4096 vs ~100 there): the planner's working-memory table is calibrated on such proportions.
        caption = " ".join(CAPTION.split()[:12]) if tiny else CAPTION
        (images / f"{i}.txt").write_text(f"{caption}, number {i}")
    files["dataset"] = images
    return files


def load_models(files: dict[str, Path], device: torch.device, storage: str = "float8"):
    """The Load node's call on these files (the one line to change when the Load node's call changes)."""
    from trainer_core.models import load_single_files

    return load_single_files(files["transformer"], files["text_encoder"], files["vae"], storage=storage,
                             compute_dtype=torch.bfloat16, device=device, text_encoder_fp8="auto")


@dataclasses.dataclass
class Row:
    config: str
    blocks_to_swap: int | None
    phase: str
    measured: Measured
    planned_gpu: int
    planned_allocated: int
    planned_host: int


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    detail: str


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny dims on the CPU (exercises the same code path)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "gpu_check_results.md"))
    parser.add_argument("--workdir", default=None, help="where the model files go (default: a temporary folder)")
    parser.add_argument("--keep-files", action="store_true", help="keep --workdir's files")
    parser.add_argument("--steps", type=int, default=None, help="training steps per swap setting (default 5, tiny 3)")
    parser.add_argument("--budget-gb", type=float, default=16.0, help="budget of the planner's choice (GiB)")
    args = parser.parse_args(argv)

    from trainer_core.runs.cli import _quiet_libraries

    _quiet_libraries()
    cuda = not args.tiny
    if cuda and not torch.cuda.is_available():
        raise SystemExit("gpu_check.py needs a CUDA device; run it with --tiny to exercise the code path on a CPU")
    device = torch.device("cuda" if cuda else "cpu")
    steps = args.steps or (5 if cuda else 3)
    started = time.perf_counter()
    lines: list[str] = []

    def log(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    from trainer_core.planner.plan import PROCESS_BASELINE_BYTES
    import trainer_core.data.cache, trainer_core.models, trainer_core.families.sampling, trainer_core.training  # noqa: E401,F401
    # (imported before the baseline is measured: the libraries' memory is the process's, not a phase's)

    if cuda:
        torch.cuda.init()
        torch.empty(1, device=device)  # the context now exists
        free0, total0 = torch.cuda.mem_get_info(device)
        context = total0 - free0 - torch.cuda.memory_reserved(device)
    else:
        context = 0
    baseline = HostPeak.now()
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="qwen_gpu_check_"))
    rows: list[Row] = []
    checks: list[Check] = []
    try:
        run_lifecycle(args, cuda, device, steps, context, workdir, rows, checks, log)
    finally:
        if not args.keep_files:
            shutil.rmtree(workdir, ignore_errors=True)

    unit, u = (GIB, "GiB") if cuda else (MIB, "MiB")
    log(f"| configuration | phase | GPU measured ({u}) | GPU planned ({u}) | allocated measured / planned ({u}) "
        f"| host RAM measured ({u}) | host RAM planned ({u}) | seconds |")
    log("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        m = r.measured
        allocated = f"{m.gpu_allocated / unit:.2f} / {r.planned_allocated / unit:.2f}" if m.gpu_allocated else "-"
        gpu = f"{m.gpu_total / unit:.2f} | {r.planned_gpu / unit:.2f} | {allocated}" if cuda else f"- | - | {allocated}"
        log(f"| {r.config} | {r.phase} | {gpu} | {m.host / unit:.2f} | {r.planned_host / unit:.2f} | {m.seconds:.1f} |")
    log("")
    log(f"Process baseline measured after the imports (resident anonymous + shared): {baseline / GIB:.2f} GiB; the "
        f"planner assumes {PROCESS_BASELINE_BYTES / GIB:.2f} GiB in every phase's host figure."
        + (f" CUDA context and other memory outside torch's allocator at the start: {context / MIB:.0f} MiB "
           "(the planner used it instead of its assumed 512 MiB)." if cuda else ""))
    log("")
    log("| check | result | detail |")
    log("| --- | --- | --- |")
    for c in checks:
        log(f"| {c.name} | {'ok' if c.ok else 'FAILED'} | {c.detail} |")
    log("")
    failed = [c for c in checks if not c.ok]
    log(f"Total time {time.perf_counter() - started:.0f} s.")
    verdict = (f"VERDICT: PASS: all {len(checks)} checks" if not failed else
               f"VERDICT: FAIL: {len(failed)} of {len(checks)} checks failed: {'; '.join(c.name for c in failed)}")
    log(verdict)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 1 if failed else 0


def run_lifecycle(args, cuda, device, steps, context, workdir, rows, checks, log) -> None:
    import numpy as np

    from trainer_core.data.cache import build_cache
    from trainer_core.core.config import DatasetConfig, LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.data.images import discover
    from trainer_core.devtools.memprobe import LiveBytes
    from trainer_core.adapters.lora_files import read_lora_file
    from trainer_core.models.text_encoder_file import resolve_text_encoder_fp8
    from trainer_core.planner import arch_for_components, auto_blocks_to_swap, inputs_for_run, plan_memory, plan_phases
    from trainer_core.planner.phases import gpu_peak_after_caching
    from trainer_core.planner.inference import parts_for_components
    from trainer_core.families.sampling import sample_image
    from trainer_core.training import Trainer

    side = SIDE_TINY if args.tiny else SIDE_REAL
    t = time.perf_counter()
    files = write_files(workdir, args.tiny, device)
    size = sum(f.stat().st_size for f in workdir.rglob("*") if f.is_file())
    log(f"# GPU check: {'real-size Qwen-Image' if cuda else 'tiny (--tiny)'} on {hardware_line(cuda, device)}")
    log("")
    log(f"`python benchmarks/gpu_check.py{' --tiny' if args.tiny else ''}`, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}. Files written in {time.perf_counter() - t:.0f} s "
        f"({size / GIB:.2f} GiB, random weights). Training: {IMAGES} images at {side}x{side}, LoRA rank "
        f"{4 if args.tiny else 32} attention+mlp fp32, AdamW8bit, gradient checkpointing, batch 1, {steps} steps per "
        f"swap setting; previews {side}x{side}, CFG 4, {PREVIEW_STEPS} sampling steps.")
    log("")

    te_mode = resolve_text_encoder_fp8("auto", device)
    with phase(cuda, device) as load_m:
        components = load_models(files, device)
    parts = parts_for_components(components)  # while the text encoder is loaded: its real sizes
    samples = discover(DatasetConfig(folder=str(files["dataset"]), resolution=side, min_bucket_side=32,
                                     max_bucket_side=2 * side))
    with phase(cuda, device) as cache_m:
        cached = build_cache(components, samples, workdir / "cache", preview_prompts=["a red bicycle"],
                             negative_prompt="blurry")
    arch = arch_for_components(components)
    lora = LoraConfig(rank=4 if args.tiny else 32, alpha=4.0 if args.tiny else 32.0, targets="attention+mlp")
    optimizer = OptimizerConfig(optimizer="adamw8bit", learning_rate=1e-4)

    def planned(k: int):
        train = TrainConfig(seed=0, gradient_checkpointing=True, blocks_to_swap=k, run_name=f"gpu-check-{k}")
        inputs = inputs_for_run(components, cached, lora, optimizer, train, k)
        inputs = dataclasses.replace(inputs, cuda_context_bytes=context, preview_width=side, preview_height=side,
                                     text_encoder_storage="float8" if te_mode == "keep" else "bfloat16")
        return train, inputs, plan_phases(inputs, arch, parts=parts, suggest=False)

    def row(config: str, k: int | None, name: str, m: Measured, plan) -> None:
        p = plan.phases[name]
        alloc = sum(t.bytes for t in p.gpu if t.name not in ("allocator slack", "CUDA context"))
        if not cuda and name == "train":  # the device's share, which the CPU's host figure also holds
            alloc = plan.training.gpu_total
        rows.append(Row(config, k, name, m, p.gpu_bytes, alloc, p.host_bytes))

    _, _, plan0 = planned(0)
    row("(all)", None, "load", load_m, plan0)
    row("(all)", None, "cache", cache_m, plan0)

    # The planner's choice first: the most swapped blocks, so later settings only bring blocks back to the GPU.
    budget = int(args.budget_gb * GIB)
    if args.tiny:  # the CPU has no budget: the planner's GPU figures (no context, no slack) at 3 swapped blocks
        as_gpu = dataclasses.replace(planned(0)[1], device="cuda", cuda_context_bytes=0, allocator_slack=0.0)
        budget = gpu_peak_after_caching(plan_memory(dataclasses.replace(as_gpu, blocks_to_swap=3), arch), arch, parts)
        choice = auto_blocks_to_swap(as_gpu, budget, arch, parts)
        settings = [("auto (tiny budget)", choice.blocks_to_swap), ("2 swapped", 2), ("1 swapped", 1),
                    ("no swapping", 0)]
    else:
        choice = auto_blocks_to_swap(planned(0)[1], budget, arch, parts)
        settings = [(f"auto for {args.budget_gb:g} GiB", choice.blocks_to_swap), ("16 swapped", 16),
                    ("8 swapped", 8), ("no swapping", 0)]
    if choice.blocks_to_swap is None:
        raise SystemExit("\n".join(choice.advice))

    first_losses, lora_a, auto_peaks = {}, {}, []
    probe_blocks = {0, arch.num_blocks // 2, arch.num_blocks - 1}  # resident in some settings, swapped in others
    settings = [(f"{label} ({k} swapped)" if label.startswith("auto") else label, k) for label, k in settings]
    if not cuda:
        # The first step of the process fills diffusers' RoPE cache (kept for the process, not the run's); on the
        # tiny model it is a few percent of the device bytes, so one unmeasured step keeps it out of the first row.
        warm = Trainer(components, cached, lora, optimizer, planned(settings[0][1])[0])
        warm.train(1)
        warm.close()
    for label, k in settings:
        train_cfg, _, plan = planned(k)
        with phase(cuda, device) as m:
            # With a run folder each train() ends with a checkpoint (on the GPU: its CPU copy is host RAM). On
            # the CPU the steps' device bytes are measured tensor by tensor: a checkpoint there is not training.
            run_dir = workdir / "runs" / f"k{k}" if cuda else None
            trainer = Trainer(components, cached, lora, optimizer, train_cfg, run_dir=run_dir)
        row(label, k, "init", m, plan)
        with phase(cuda, device) as m:
            if cuda:
                report = trainer.train(1)
                report2 = trainer.train(steps - 1)
            else:  # no allocator statistics: the device's bytes are the resident tensors + the steps' new ones
                resident = common.resident_bytes(trainer)
                with LiveBytes() as live:
                    report = trainer.train(1)
                    report2 = trainer.train(steps - 1)
                m.gpu_allocated = resident + live.peak
        row(label, k, "train", m, plan)
        losses = report.losses + report2.losses
        first_losses[label] = losses[0]
        with phase(cuda, device) as m:
            image = sample_image(components, cached, "a red bicycle", "blurry", side, side, steps=PREVIEW_STEPS,
                                 cfg_scale=4.0, seed=0)
        row(label, k, "preview", m, plan)
        pixels = np.asarray(image, dtype=np.float32)
        checks.append(Check(f"{label}: preview", image.size == (side, side) and bool(np.isfinite(pixels).all()),
                            f"{image.size[0]}x{image.size[1]}, mean {pixels.mean():.1f}"))
        with phase(cuda, device) as m:
            path = trainer.save_lora(workdir / f"lora_{k}.safetensors")
        row(label, k, "save", m, plan)
        saved = read_lora_file(path)
        lora_a[label] = {m: a.float() for m, (a, _) in saved.weights.items() if int(m.split(".")[1]) in probe_blocks}
        checks.append(Check(f"{label}: LoRA file", sorted(saved.targets) == sorted(trainer.lora_modules),
                            f"{len(saved.targets)} modules, rank {saved.rank}; losses {losses[0]:.4f} -> "
                            f"{losses[-1]:.4f}; {report2.step_seconds:.2f} s/step over steps 2..{steps}"
                            + (" (a checkpoint included)" if cuda else "")))
        trainer.close()
        del trainer
        if label.startswith("auto"):
            auto_peaks = [r.measured.gpu_total for r in rows if r.config == label]

    # The checks on the measurements.
    for r in rows:
        m = r.measured
        if cuda:
            # A phase that plans no GPU use (loading reads headers) plans no context either: torch's share counts.
            used = m.gpu_total if r.planned_gpu else m.gpu_total - m.gpu_outside
            checks.append(Check(f"{r.config} {r.phase}: GPU within plan", used <= r.planned_gpu,
                                f"{used / GIB:.2f} of {r.planned_gpu / GIB:.2f} GiB"))
            checks.append(Check(f"{r.config} {r.phase}: host RAM within plan", m.host <= r.planned_host,
                                f"{m.host / GIB:.2f} of {r.planned_host / GIB:.2f} GiB"))
        if r.phase == "train":  # on the CPU: the 4-block model's device bytes, measured tensor by tensor
            ratio = r.planned_allocated / max(m.gpu_allocated, 1)
            limit = 1.15 if cuda else 1.05
            checks.append(Check(f"{r.config} train: plan within {limit - 1:.0%} of allocated", 1.0 <= ratio <= limit,
                                f"planned / measured = {ratio:.3f}"))
    if cuda:
        peak = max(auto_peaks)
        checks.append(Check(f"{settings[0][0]} ({settings[0][1]} blocks) within its budget", peak <= budget,
                            f"{peak / GIB:.2f} of {budget / GIB:.2f} GiB at its largest phase"))
    values = list(first_losses.values())
    same = all(math.isfinite(v) and abs(v - values[0]) <= 1e-3 * abs(values[0]) for v in values)
    checks.append(Check("first loss equal for every swap setting", same,
                        ", ".join(f"{k}: {v:.5f}" for k, v in first_losses.items())))
    # The LoRA's A matrices start random (B at zero, so the first loss cannot tell inits apart): after the
    # same steps from one init they differ by the GPU's nondeterminism only; from different inits, by ~100%.
    first = next(iter(lora_a.values()))
    worst = max(float((a[m] - first[m]).abs().max() / first[m].abs().max()) for a in lora_a.values() for m in first)
    checks.append(Check("same LoRA for every swap setting", worst <= 1e-2,
                        f"largest difference of A (blocks {sorted(probe_blocks)}) to the first setting's: "
                        f"{worst:.2e} of its largest value"))


def hardware_line(cuda: bool, device: torch.device) -> str:
    if cuda:
        return f"{torch.cuda.get_device_name(device)}, {torch.cuda.mem_get_info(device)[1] / GIB:.1f} GiB"
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"


if __name__ == "__main__":
    raise SystemExit(main())
