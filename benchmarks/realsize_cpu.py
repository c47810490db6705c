"""Rehearse the real 20B Qwen-Image on the CPU: every phase of a run at real size, measured against the plan.

    make realsize                      # or: .venv/bin/python benchmarks/realsize_cpu.py [--dir D] [--clean]
    .venv/bin/python benchmarks/realsize_cpu.py --model qwen-image-2.1 [--blocks N]    # Qwen-Image 2.1

Qwen-Image 2.1 (`--model qwen-image-2.1`): the same phases on random-weight files in the layouts our 2.1
loaders read (`families/qwen_image21/random_files.py`: the transformer in ComfyUI's fp8_e4m3fn layout with the MLP fused,
7.2 GB at 32 blocks; Qwen3-VL-8B as a scaled-fp8 file, 10.5 GB; the 2.1 VAE file, bf16), loaded as the Load node
does with those three files and a diffusers folder for the processor (`families/qwen_image21/folder.py`);
`--blocks N` writes N real-width blocks instead of 32. Results go to benchmarks/realsize_cpu21.json. `--int8`: the
transformer and the text encoder as ComfyUI's int8 ConvRot files (`qwen_image_2.1_int8_convrot`,
`qwen3vl_8b_int8_convrot`: the files its 2.1 templates download), kept in int8 (with `--text-encoder-fp8 keep`);
`--stream-encoder N`: caching streams N of the text encoder's decoder layers (streaming/encoder.py), as on a GPU too
small for it. Such runs write realsize_cpu21_int8[_streamed].json (and realsize_cpu_streamed.json for Qwen-Image).

1. Writes random-weight files with the exact shapes, dtypes and key layouts of ComfyUI's real files
   (`devtools/random_files.py`: qwen_image_fp8_e4m3fn 20.4 GB, qwen_2.5_vl_7b_fp8_scaled 9.4 GB with its
   vision tower, scales and lm_head, qwen_image_vae 0.25 GB), tensor by tensor, unless they are in --dir.
2. Runs the engine calls the nodes make, in bf16 on the CPU (where the "GPU" share of memory lands in host
   RAM too), one phase at a time:
     load     Load Models          load_single_files: headers, tokenizer, file identities
     cache    Cache Latents/Text   4 images at 512² + captions, the preview prompts; the training set at a
                                   small bucket (--train-size), then the encoders are dropped
     init     Init Trainer         runs.open_run, rank 16: the transformer streams in
     train    Train Steps          2 steps
     preview  Preview              1 image, 2 sampling steps, true CFG
     save     Save LoRA            ComfyUI's layout; then the run is released
3. Records per phase the peak resident memory (the kernel's high-water mark, reset at each phase start) and
   seconds, against the planner's host-RAM prediction for that phase (`planner.phases`, device = CPU), and
   ends with one line: `realsize: peak_rss_gib=X planned_gib=Y phases=load,...,save ok` (or FAIL with why).
   Results go to benchmarks/realsize_cpu.json.

It runs in a child process under a memory cap (--cap-gib, default 22): a memory cgroup where one can be made,
and a watchdog in any case (`memory_cap.py`), so an overshoot fails the script, not the machine. Files are
read with plain reads, so the page cache does not count as the process' memory. --clean deletes the files
(about 30 GB) after the run; --clean-only deletes them without running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)
import memory_cap

GIB = 1 << 30
OUT = Path(__file__).resolve().parent / "realsize_cpu.json"
OUT21 = Path(__file__).resolve().parent / "realsize_cpu21.json"
QWEN21 = "qwen-image-2.1"
PHASES = ("load", "cache", "init", "train", "preview", "save")
HOST_RESERVE_GIB = 4  # planner.phases.HOST_RESERVE_BYTES
TOLERANCE = 0.10  # each phase's planned host RAM within 10% of the measured peak
PROMPT = "a red circle on a white background"
NEGATIVE = "blurry"


def default_dir() -> Path:
    return Path(os.environ.get("QWEN_LORA_REALSIZE_DIR", Path.home() / ".cache" / "qwen-lora-realsize"))


# --------------------------------------------------------------------------------------------------
# measuring one phase

def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


class Phase:
    """`with Phase(name, results):` records seconds and the peak resident memory of the block."""

    def __init__(self, name: str, results: dict, log):
        self.name, self.results, self.log = name, results, log

    def __enter__(self):
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
        self.start = time.perf_counter()
        self.log(f"-- {self.name} ...")
        return self

    def __exit__(self, kind, *_):
        if kind is None:
            seconds = time.perf_counter() - self.start
            peak, now = _status_kib("VmHWM") * 1024, _status_kib("VmRSS") * 1024
            self.results[self.name] = {"seconds": round(seconds, 1), "peak_rss_bytes": peak, "end_rss_bytes": now}
            self.log(f"   {self.name}: {seconds:.1f} s, peak RSS {peak / GIB:.2f} GiB, at the end {now / GIB:.2f} GiB")


# --------------------------------------------------------------------------------------------------
# the rehearsal

def write_files(models: Path, log) -> dict[str, Path]:
    """The three real-size files under `models` (ComfyUI's sub-folders); a file already there is kept."""
    from trainer_core.devtools.random_files import write_random_text_encoder, write_random_transformer, write_vae

    writers = {
        "transformer": ("diffusion_models/qwen_image_fp8_e4m3fn.safetensors", write_random_transformer),
        "text_encoder": ("text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors",
                         lambda path, seed: write_random_text_encoder(path, seed=seed, whole=True)),
        "vae": ("vae/qwen_image_vae.safetensors", write_vae),
    }
    files = {}
    for seed, (part, (relative, write)) in enumerate(writers.items()):
        path = models / relative
        if not path.is_file():
            log(f"writing {path}")
            temp = path.with_name(path.name + ".part")  # a killed write leaves no file that looks complete
            write(temp, seed=seed)
            temp.replace(path)
        files[part] = path
    return files


def write_files21(models: Path, blocks: int | None, log, int8: bool = False) -> dict[str, Path]:
    """Qwen-Image 2.1's three real-size files and a diffusers folder with the processor (the offline tiny BPE:
    the real tokenizer is not on this machine); a file already there is kept. `int8`: the transformer and the text
    encoder as ComfyUI's int8 ConvRot files (the names and layout its 2.1 templates download), else float8."""
    import json as _json

    from trainer_core.families.qwen_image21.random_files import write_random_qwen3_vl, write_random_transformer21, write_vae21
    from trainer_core.families.qwen_image21.tiny import QWEN_IMAGE21_SCHEDULER_CONFIG
    from trainer_core.models.tiny import build_tiny_tokenizer

    fmt, encoder_fmt = ("int8_convrot", "int8_convrot") if int8 else ("fp8_e4m3fn", "fp8_scaled")
    stem = f"qwen_image_2.1_{fmt}" + (f"_{blocks}blocks" if blocks is not None else "")
    writers = {
        "transformer": (f"diffusion_models/{stem}.safetensors",
                        lambda path, seed: write_random_transformer21(path, num_layers=blocks, seed=seed, fmt=fmt)),
        "text_encoder": (f"text_encoders/qwen3vl_8b_{encoder_fmt}.safetensors",
                         lambda path, seed: write_random_qwen3_vl(path, seed=seed, fmt=encoder_fmt)),
        "vae": ("vae/qwen_image_2.1_vae_bf16.safetensors", write_vae21),
    }
    files = {}
    for seed, (part, (relative, write)) in enumerate(writers.items()):
        path = models / relative
        if not path.is_file():
            log(f"writing {path}")
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.with_name(path.name + ".part")  # a killed write leaves no file that looks complete
            write(temp, seed=seed)
            temp.replace(path)
            if temp.with_suffix(".json").is_file():
                temp.with_suffix(".json").replace(path.with_suffix(".json"))
        files[part] = path
    folder = models / "qwen_image21_folder"
    build_tiny_tokenizer().save_pretrained(str(folder / "processor"))
    (folder / "scheduler").mkdir(parents=True, exist_ok=True)
    (folder / "scheduler" / "scheduler_config.json").write_text(_json.dumps(QWEN_IMAGE21_SCHEDULER_CONFIG))
    (folder / "model_index.json").write_text(_json.dumps({"_class_name": "QwenImage21Pipeline"}))
    files["folder"] = folder
    return files


def import_libraries() -> None:
    """Import the model classes the run uses (diffusers and transformers import them lazily, on first use), so
    the measured baseline is what the planner's term says: Python and the libraries, before any model."""
    import bitsandbytes  # noqa: F401
    import peft  # noqa: F401
    from diffusers import AutoencoderKLQwenImage, QwenImagePipeline, QwenImageTransformer2DModel  # noqa: F401
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer  # noqa: F401


def import_libraries21() -> None:
    """import_libraries for Qwen-Image 2.1's classes."""
    import bitsandbytes  # noqa: F401
    import peft  # noqa: F401
    from diffusers import AutoencoderKLQwenImage21, QwenImage21Pipeline, QwenImage21Transformer2DModel  # noqa: F401
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration  # noqa: F401


def make_images(folder: Path, count: int, size: int) -> Path:
    """`count` coloured-shape images of size² pixels with captions."""
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    colours = [("red", (220, 40, 40)), ("green", (40, 170, 60)), ("blue", (40, 70, 220)), ("yellow", (235, 200, 30))]
    for n in range(count):
        name, rgb = colours[n % len(colours)]
        shape = "circle" if n % 2 == 0 else "square"
        img = Image.new("RGB", (size, size), "white")
        m = size // 4
        (ImageDraw.Draw(img).ellipse if shape == "circle" else ImageDraw.Draw(img).rectangle)(
            (m, m, size - m, size - m), fill=rgb)
        img.save(folder / f"{n:02d}.png")
        (folder / f"{n:02d}.txt").write_text(f"a {name} {shape} on a white background\n")
    return folder


def planned_host_bytes(args, settings, dataset, components, baseline: int) -> dict[str, int]:
    """The planner's host-RAM peak per phase for this rehearsal (device = CPU: the GPU's share is host RAM),
    from the plan inputs Init Trainer reads off the run (`for_run.inputs_for_run`), with the process as
    measured before loading (`baseline`) instead of the assumed 1 GiB; the cache phase at the cache's size."""
    import dataclasses

    from trainer_core.planner.arch import arch_for_components
    from trainer_core.planner.for_run import inputs_for_run
    from trainer_core.planner.inference import parts_for_components
    from trainer_core.planner.phases import plan_phases

    inputs = dataclasses.replace(
        inputs_for_run(components, dataset, *settings), process_baseline_bytes=baseline,
        text_encoder_storage="bfloat16" if args.text_encoder_fp8 == "dequantize" else "float8",
        text_encoder_streamed=args.stream_encoder,
        preview_width=args.train_size, preview_height=args.train_size, preview_cfg=True)
    arch, parts = arch_for_components(components), parts_for_components(components)
    planned = {name: phase.host_bytes for name, phase in plan_phases(inputs, arch, parts=parts).phases.items()}
    at_cache_size = dataclasses.replace(inputs, width=args.cache_size, height=args.cache_size)
    planned["cache"] = plan_phases(at_cache_size, arch, parts=parts).phases["cache"].host_bytes
    return planned


def rehearse(args, log) -> int:
    import torch

    from trainer_core.runs import registry as runs
    from trainer_core.data.cache import build_cache
    from trainer_core.core.config import DatasetConfig, LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.data.images import discover
    from trainer_core.families.qwen_image import load_single_files
    from trainer_core.models.tiny import build_tiny_tokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    root = Path(args.dir)
    memory_cap.start_watchdog(int(args.cap_gib * GIB))
    Path("/proc/self/oom_score_adj").write_text("1000")  # if the machine runs short anyway, this goes first
    # The RAM this run may use is the cap: Init Trainer's check reads the machine's RAM (less the 4 GiB the
    # planner leaves to the system) from this variable.
    os.environ["QWEN_LORA_HOST_RAM_GB"] = str(args.cap_gib + HOST_RESERVE_GIB)
    started = time.perf_counter()
    qwen21 = args.model == QWEN21
    if qwen21:
        files = write_files21(root / "models", args.blocks, log, args.int8)  # written by the parent already: found here
    else:
        files = write_files(root / "models", log)  # written by the parent already: found here
        tokenizer = root / "models" / "tokenizer"  # the real one is not on this machine: the offline tiny BPE
        build_tiny_tokenizer().save_pretrained(str(tokenizer))
    images = make_images(root / "images", args.images, args.cache_size)
    work = root / "work"
    shutil.rmtree(work, ignore_errors=True)  # a fresh cache and run each time: every phase does its work

    results: dict[str, dict] = {}
    import_libraries21() if qwen21 else import_libraries()
    baseline = memory_cap.rss_bytes()  # the process with its libraries, before any model
    with Phase("load", results, log):
        if qwen21:
            from trainer_core.families.qwen_image21.folder import load_qwen_image21_folder

            components = load_qwen_image21_folder(files["folder"], files["transformer"], storage="float8",
                                                  compute_dtype=torch.bfloat16, device="cpu",
                                                  text_encoder_file=files["text_encoder"], vae_file=files["vae"],
                                                  text_encoder_fp8=args.text_encoder_fp8)
        else:
            components = load_single_files(files["transformer"], files["text_encoder"], files["vae"], tokenizer,
                                           storage="float8", compute_dtype=torch.bfloat16, device="cpu",
                                           text_encoder_fp8=args.text_encoder_fp8)
    if args.stream_encoder:  # on the CPU nothing needs it: streamed as a GPU that cannot hold the encoder streams it
        from trainer_core.planner.device import CachingPlacement
        from trainer_core.streaming.encoder import StreamedLayers

        components.text_encoder_placement = CachingPlacement(components, args.text_encoder_fp8 == "keep",
                                                             StreamedLayers(decoder=args.stream_encoder))
    with Phase("cache", results, log):
        for size in (args.cache_size, args.train_size):
            dataset = build_cache(components, discover(DatasetConfig(folder=str(images), resolution=size)),
                                  work / "cache", preview_prompts=[PROMPT], negative_prompt=NEGATIVE)
            log(f"   cache at {size}²: {dataset.report.summary()}")
    train = TrainConfig(run_name="realsize", gradient_checkpointing=True, blocks_to_swap=0, seed=0)
    settings = (LoraConfig(rank=args.rank, alpha=float(args.rank)), OptimizerConfig(optimizer="adamw8bit"), train)
    if args.stop_after == "cache":
        return 0
    with Phase("init", results, log):
        trainer = runs.open_run(components, dataset, *settings, run_dir=work / "run",
                                preview_size=(args.train_size, args.train_size)).trainer
    with Phase("train", results, log):
        report = trainer.train(args.steps)
        log(f"   losses: {[round(x, 4) for x in report.losses]}")
    with Phase("preview", results, log):
        image = trainer.sample_preview(PROMPT, NEGATIVE, width=args.train_size, height=args.train_size,
                                       steps=args.sample_steps, cfg_scale=4.0, seed=0)
        image.save(work / "preview.png")
    with Phase("save", results, log):
        lora = trainer.save_lora(work / "realsize_lora.safetensors")
        runs.release("realsize")
    log(f"   LoRA: {lora} ({lora.stat().st_size / 2**20:.0f} MiB)")

    out = results_path(args)
    out.write_text(json.dumps({"phases": results}, indent=2) + "\n")  # kept if planning fails below
    planned = planned_host_bytes(args, settings, dataset, components, baseline)
    return report_results(results, planned, log, total_seconds=time.perf_counter() - started,
                          finite=all(x == x for x in report.losses), out=out)


def report_results(results: dict, planned: dict[str, int], log, total_seconds: float, finite: bool,
                   out: Path = OUT) -> int:
    log("")
    log("| phase | seconds | measured peak RSS (GiB) | planned host (GiB) | planned / measured |")
    log("|---|---:|---:|---:|---:|")
    failures = []
    for name in PHASES:
        r = results[name]
        measured, plan = r["peak_rss_bytes"], planned[name]
        r["planned_host_bytes"] = plan
        ratio = plan / measured
        log(f"| {name} | {r['seconds']:.1f} | {measured / GIB:.2f} | {plan / GIB:.2f} | {ratio:.3f} |")
        if abs(ratio - 1) > TOLERANCE:
            failures.append(f"{name}: planned {plan / GIB:.2f} GiB vs measured {measured / GIB:.2f} GiB")
    peak = max(r["peak_rss_bytes"] for r in results.values())
    planned_peak = max(planned[name] for name in PHASES)
    if peak > 22 * GIB:
        failures.append(f"peak RSS {peak / GIB:.2f} GiB is over 22 GiB")
    if not finite:
        failures.append("a training loss was not finite")
    out.write_text(json.dumps({"phases": results, "peak_rss_bytes": peak, "planned_peak_bytes": planned_peak,
                               "total_seconds": round(total_seconds), "failures": failures}, indent=2) + "\n")
    verdict = "ok" if not failures else "FAIL (" + "; ".join(failures) + ")"
    log(f"total {total_seconds / 60:.1f} min")
    log(f"realsize: peak_rss_gib={peak / GIB:.2f} planned_gib={planned_peak / GIB:.2f} phases={','.join(PHASES)} {verdict}")
    return 0 if not failures else 1


def results_path(args) -> Path:
    """realsize_cpu.json (Qwen-Image), realsize_cpu21.json (2.1), with `_int8` and `_streamed` for those runs."""
    base = OUT21 if args.model == QWEN21 else OUT
    suffix = ("_int8" if args.int8 else "") + ("_streamed" if args.stream_encoder else "")
    return base.with_name(base.stem + suffix + base.suffix)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen-image", choices=("qwen-image", QWEN21))
    parser.add_argument("--blocks", type=int, default=None, help="2.1: real-width transformer blocks (default: 32, "
                        "the real model's)")
    parser.add_argument("--dir", default=str(default_dir()), help="where the 30 GB of model files go (default %(default)s)")
    parser.add_argument("--cap-gib", type=float, default=22.0, help="memory cap for the run (default %(default)s)")
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--cache-size", type=int, default=512, help="side of the cached images (default %(default)s)")
    parser.add_argument("--train-size", type=int, default=128, help="training and preview bucket side (default %(default)s)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--sample-steps", type=int, default=2)
    parser.add_argument("--text-encoder-fp8", default="dequantize", choices=("dequantize", "keep"))
    parser.add_argument("--int8", action="store_true", help="2.1: ComfyUI's int8 ConvRot transformer and text encoder "
                        "files (its templates' own), kept in int8 (with --text-encoder-fp8 keep for the encoder)")
    parser.add_argument("--stream-encoder", type=int, default=0, help="caching: stream this many of the text encoder's "
                        "decoder layers from host memory, as a GPU too small for it does (default: none)")
    parser.add_argument("--clean", action="store_true", help="delete the model files after the run")
    parser.add_argument("--clean-only", action="store_true", help="delete the model files and stop")
    parser.add_argument("--stop-after", choices=("cache",), help="for development: stop after this phase")
    parser.add_argument("--in-cap", action="store_true", help=argparse.SUPPRESS)  # the capped child
    args = parser.parse_args()
    if args.clean_only:
        shutil.rmtree(args.dir, ignore_errors=True)
        print(f"deleted {args.dir}")
        return 0
    if args.in_cap:
        return rehearse(args, log=lambda line: print(line, flush=True))
    # The files are written here, before the capped child starts: the measured process then holds nothing
    # of the writing (its pools, the VAE it builds) when the first phase begins.
    started = time.perf_counter()
    if args.model == QWEN21:
        write_files21(Path(args.dir) / "models", args.blocks, log=print, int8=args.int8)
    else:
        write_files(Path(args.dir) / "models", log=print)
    print(f"model files ready in {time.perf_counter() - started:.0f} s")
    argv = [sys.executable, __file__, *sys.argv[1:], "--in-cap"]
    status = memory_cap.run_capped(argv, args.cap_gib)
    if status != 0:
        print(f"realsize: the rehearsal ended with status {status}"
              + (" (killed: over the memory cap)" if status in (137, -9, 3) else ""))
    if args.clean:
        shutil.rmtree(args.dir, ignore_errors=True)
        print(f"deleted {args.dir}")
    return status


if __name__ == "__main__":
    sys.exit(main())
