"""GPU check of the memory plan, phase by phase, over the whole life of a real-size Qwen-Image run, and of
streaming's correctness (a streamed step against the all-resident one, same batches).

    python benchmarks/gpu_check.py [--out DIR] [--workdir DIR]   # CUDA (part of benchmarks/device_check.sh)
    python benchmarks/gpu_check.py --tiny                        # CPU, tiny dims, the same code path

1. files   Real-layout model files with random weights, made on the device tensor by tensor and streamed to
           --workdir (`devtools.random_files`; one tensor of host RAM at a time): the transformer as ComfyUI's
           fp8_e4m3fn file (19 GiB), the text encoder's language model as its fp8_scaled file (7.1 GiB), the
           VAE (bf16), the tiny tokenizer and 4 random 1024 x 1024 images with captions. Removed at the end
           unless --keep-files. The load phase must read real files: that is what it measures.
2. load    The Load node's call (`load_models`). 3. cache: `build_cache` (latents, captions, a preview prompt,
           the negative prompt); then the prompts again with half the text encoder's decoder layers streamed
           (`streamed_caching`: its peak against the plan's, its embeddings against the resident ones).
4. Per setting (the planner's choice for 8, 12, 16 and 24 GiB, each under that card's cap (`card_of`), and all
   resident; tiny: the tiny budget's choices standing for 8 and 12 GiB, 2 swapped, all resident), each while its time
   slice holds one more (an out-of-memory is a failed check naming the phase, and the next setting runs): init (a
   `Trainer`, rank 32 attention+mlp, fp32 LoRA, AdamW8bit, checkpointing), train (--steps),
   preview (1024 x 1024, CFG 4, 2 steps), save (`save_lora`, read back).

Measured per phase (harness.phase): GPU = max reserved + memory outside torch's allocator; max allocated;
host RAM = peak resident anonymous + shared memory. Planned: `planner.plan_phases` for the run as built,
with the measured CUDA context. On the CPU (--tiny) the GPU columns hold the training phase's device bytes
only (resident tensors + the steps' peak of new ones, `memprobe.LiveBytes`), checked within 5% of the plan.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import math
import re
import shutil
import tempfile
from pathlib import Path

import common
import harness
from harness import Env, Report, gib

import torch

from trainer_core.planner import GIB

SIDE_REAL, SIDE_TINY = 1024, 128
IMAGES = 4
PREVIEW_STEPS = 2
CAPTION = ("a photograph of a red bicycle leaning against a weathered stone wall in a quiet village street, warm "
           "afternoon light, long shadows, potted geraniums on the window sills, a cat asleep on the doorstep, "
           "cobblestones wet from an earlier rain, a bakery sign in the distance, soft clouds over the roof tiles")
MEMORY_COLUMNS = ["setting", "blocks_to_swap", "phase", "gpu_measured", "gpu_planned", "allocated_measured",
                  "allocated_planned", "host_measured", "host_planned", "seconds"]
# Streamed against all-resident: the same kernels on the same values, so equal up to the nondeterminism of some CUDA
# backward kernels (atomics). Compared: the first loss, and the loss after one optimizer step (the second step's), each
# within this share. Not the LoRA weights after that step: from B = 0, 8-bit AdamW's first update is about lr * sign(grad)
# per element whatever the gradient's size, so a near-zero gradient whose sign a nondeterministic kernel flips moves its
# element by 2 lr: the first device check (an H100) measured the LoRA B matrices 2.0e-2 of their norm apart with
# identical first losses, while the losses after five steps agreed to 2e-5. The loss after the step reads the whole
# update through the model, where such flips of negligible gradients weigh as little as the gradients did.
STREAMING_TOLERANCE = 1e-3
# The cards each budgeted setting plays (GiB; the planner's choice for each, run under that card's cap). Tiny: the tiny
# model's budget (what automatic swapping must fit at 3 swapped blocks) times these factors stands for 8 and 12 GiB.
CARDS_GIB = (24, 16, 12, 8)
TINY_CARDS = {8: 1.0, 12: 1.5}


def write_files(workdir: Path, tiny: bool, device: torch.device) -> dict[str, Path]:
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
    from trainer_core.families.qwen_image import load_single_files

    return load_single_files(files["transformer"], files["text_encoder"], files["vae"], storage=storage,
                             compute_dtype=torch.bfloat16, device=device, text_encoder_fp8="auto")


def streamed_caching(env: Env, report: Report, components, samples, workdir: Path, cached, parts, plan0, arch,
                     one_byte: bool, row) -> None:
    """Caching again with half the text encoder's decoder layers streamed (streaming/encoder.py), as on a GPU too small
    for it: a 'memory per phase' row against the plan's cache phase at that count, and a check that every prompt it
    encodes equals, bit for bit, the resident encoder's (the images' latents are reused: only the prompts run)."""
    from safetensors.torch import load_file

    from trainer_core.data.cache import build_cache
    from trainer_core.planner import plan_phases
    from trainer_core.planner.device import CachingPlacement
    from trainer_core.streaming.encoder import StreamedLayers

    half = parts.text_layers // 2
    folder = workdir / "cache_streamed"
    shutil.copytree(cached.cache_dir / "latents", folder / "latents")
    components.text_encoder_placement = CachingPlacement(components, one_byte, StreamedLayers(decoder=half))
    with harness.phase(env) as streamed_m:
        build_cache(components, samples, folder, preview_prompts=["a red bicycle"], negative_prompt="blurry")
    plan = plan_phases(dataclasses.replace(plan0.inputs, text_encoder_streamed=half), arch, parts=parts, suggest=False)
    row(f"text encoder streamed ({half} of {parts.text_layers} decoder layers)", None, "cache", streamed_m, plan)
    resident = {p.name: load_file(str(p)) for p in (cached.cache_dir / "text").glob("*.safetensors")}
    streamed = {p.name: load_file(str(p)) for p in (folder / "text").glob("*.safetensors")}
    same = resident.keys() == streamed.keys() and all(
        torch.equal(resident[n][k], streamed[n][k]) for n in resident for k in resident[n])
    report.check("caching with the text encoder streamed encodes each prompt as the resident encoder does, bit for bit",
                 same, f"{len(streamed)} prompt entries")


def probe_lora(trainer, blocks: set[int]) -> dict[str, torch.Tensor]:
    """CPU copies of the LoRA tensors of `blocks` (resident in some settings, streamed in others)."""
    # (a copy: on the CPU a float32 parameter's .float().cpu() is the parameter itself, which trains on)
    return {n: p.detach().float().cpu().clone() for n, p in trainer.built.transformer.named_parameters()
            if p.requires_grad and _block_of(n) in blocks}


def _block_of(name: str) -> int | None:
    found = re.search(r"transformer_blocks\.(\d+)\.", name)
    return int(found.group(1)) if found else None


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, bool]:
    """||a - b|| / ||b|| over the LoRA B matrices (after one step from B = 0 the only ones changed; A's large
    random values would hide a difference), and whether every tensor is equal bit for bit. A norm rather than
    the largest element: Adam's first update is about +-lr per element whatever the gradient's size, so a
    gradient element near zero whose sign a nondeterministic kernel flips moves one element by 2 lr."""
    names = [n for n in b if "lora_B" in n] or list(b)
    diff = sum(float((a[n] - b[n]).double().pow(2).sum()) for n in names) ** 0.5
    norm = sum(float(b[n].double().pow(2).sum()) for n in names) ** 0.5
    return diff / max(norm, 1e-30), all(torch.equal(a[n], b[n]) for n in b)


def run_memory(env: Env, report: Report, clock: harness.Clock, workdir: Path, seconds: float | None = None) -> None:
    """The lifecycle above into `report`: table 'memory per phase', its checks, and 'streaming correctness'."""
    import numpy as np

    from trainer_core.data.cache import build_cache
    from trainer_core.core.config import DatasetConfig, LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.data.images import discover
    from trainer_core.devtools.memprobe import LiveBytes
    from trainer_core.adapters.lora_reading import read_lora_file
    from trainer_core.planner import (arch_for_components, auto_blocks_to_swap, inputs_for_run, plan_memory, plan_phases,
                                      resolve_text_encoder_fp8)
    from trainer_core.planner.inference import parts_for_components
    from trainer_core.planner.phases import gpu_peak_after_caching
    from trainer_core.families.sampling import sample_image
    from trainer_core.training import Trainer

    phase_started = clock.elapsed()

    def left() -> float:  # of this phase's slice (`seconds`) and of the whole run
        return min(clock.left(), float("inf") if seconds is None else seconds - (clock.elapsed() - phase_started))

    cuda, device, side = env.cuda, env.device, SIDE_TINY if env.tiny else SIDE_REAL
    rows = report.table("memory per phase", MEMORY_COLUMNS)
    with harness.phase(env) as files_m:
        files = write_files(workdir, env.tiny, device)
    size = sum(f.stat().st_size for f in workdir.rglob("*") if f.is_file())
    report.note(f"random-weight files: {size / GIB:.2f} GiB written in {files_m.seconds:.0f} s")
    te_mode = resolve_text_encoder_fp8("auto", device)
    with harness.phase(env) as load_m:
        components = load_models(files, device)
    parts = parts_for_components(components)  # while the text encoder is loaded: its real sizes
    samples = discover(DatasetConfig(folder=str(files["dataset"]), resolution=side, min_bucket_side=32,
                                     max_bucket_side=2 * side))
    with harness.phase(env) as cache_m:
        cached = build_cache(components, samples, workdir / "cache", preview_prompts=["a red bicycle"],
                             negative_prompt="blurry")
    arch = arch_for_components(components)
    lora = LoraConfig(rank=4 if env.tiny else 32, alpha=4.0 if env.tiny else 32.0, targets="attention+mlp")
    optimizer = OptimizerConfig(optimizer="adamw8bit", learning_rate=1e-4)

    def planned(k: int, budget: int | None = None):
        train = TrainConfig(seed=0, gradient_checkpointing=True, blocks_to_swap=k, run_name=f"gpu-check-{k}")
        inputs = inputs_for_run(components, cached, lora, optimizer, train, k)
        inputs = dataclasses.replace(inputs, cuda_context_bytes=env.context_bytes, preview_width=side,
                                     preview_height=side, text_encoder_storage="float8" if te_mode == "keep" else "bfloat16")
        # with a card's budget (a GPU's capped settings) the preview decodes in tiles where the card needs it
        return train, inputs, plan_phases(inputs, arch, parts=parts, suggest=False,
                                          gpu_budget_bytes=budget if cuda else None)

    def row(setting: str, k: int | None, name: str, m: harness.Measured, plan) -> None:
        p = plan.phases[name]
        alloc = sum(t.bytes for t in p.gpu if t.name not in ("allocator slack", "CUDA context"))
        if not cuda and name == "train":  # the device's share, which the CPU's host figure also holds
            alloc = plan.training.gpu_total
        rows.append(dict(setting=setting, blocks_to_swap=k, phase=name,
                         gpu_measured=gib(m.gpu_total, env) if cuda else None, gpu_planned=gib(p.gpu_bytes, env),
                         allocated_measured=gib(m.gpu_allocated, env) if m.gpu_allocated else None,
                         allocated_planned=gib(alloc, env), host_measured=gib(m.host, env),
                         host_planned=gib(p.host_bytes, env), seconds=round(m.seconds, 2),
                         _raw=(m, p.gpu_bytes, alloc, p.host_bytes)))

    _, _, plan0 = planned(0)
    row("(all)", None, "load", load_m, plan0)
    row("(all)", None, "cache", cache_m, plan0)
    streamed_caching(env, report, components, samples, workdir, cached, parts, plan0, arch, te_mode == "keep", row)

    if env.tiny:
        # The CPU has no budget: the planner's GPU figures (no context, no slack) at 3 swapped blocks. A second
        # budget would choose 3 or 0 (with 4 blocks, 0 to 2 swapped plan alike: up to 2 slots hold streamed
        # blocks), so the tiny run's second streamed setting is a fixed 2.
        as_gpu = dataclasses.replace(planned(0)[1], device="cuda", cuda_context_bytes=0, allocator_slack=0.0)
        # (its previews decoded in tiles, as within any budget their whole decode misses: budget 1)
        budget = gpu_peak_after_caching(plan_memory(dataclasses.replace(as_gpu, blocks_to_swap=3), arch), arch, parts, 1)
        budgets = [(f"auto for {g} GiB (tiny budget x{f:g})", int(budget * f),
                    auto_blocks_to_swap(as_gpu, int(budget * f), arch, parts)) for g, f in TINY_CARDS.items()]
    else:
        budgets = [(f"auto for {g} GiB", g * GIB, auto_blocks_to_swap(planned(0)[1], g * GIB, arch, parts))
                   for g in CARDS_GIB]
    settings = []
    for label, budget, choice in budgets:
        if choice.blocks_to_swap is None:
            report.check(f"{label}: the planner finds a swap count", False, " ".join(choice.advice))
        else:
            settings.append((f"{label} ({choice.blocks_to_swap} swapped)", choice.blocks_to_swap, budget))
    settings += [("2 swapped", 2, None)] if env.tiny else []
    # The most swapped first: later settings only bring blocks back to the device (on the CPU, where device
    # bytes are counted tensor by tensor, a block once streamed computes from a view into the pinned arena).
    # On a GPU all resident comes second, so the streaming check has its pair before time may cut the rest.
    settings = sorted(settings, key=lambda s: -s[1])
    settings.insert(len(settings) if env.tiny else 1, ("all resident", 0, None))

    probe_blocks = {0, arch.num_blocks // 2, arch.num_blocks - 1}
    results = {}  # setting -> (losses, LoRA after one step, LoRA at the end)
    if not cuda:
        # The first step of the process fills diffusers' RoPE cache (kept for the process, not the run's); on the
        # tiny model it is a few percent of the device bytes, so one unmeasured step keeps it out of the first row.
        warm = Trainer(components, cached, lora, optimizer, planned(settings[0][1])[0])
        warm.train(1)
        warm.close()

    running = {"phase": "init"}  # the phase now running: an out-of-memory names it

    def one_setting(label: str, k: int, budget: int | None) -> None:
        """init, train, preview and save at `k` swapped blocks, each phase a row; the LoRA probes into `results`."""
        train_cfg, _, plan = planned(k, budget)
        running["phase"] = "init"
        with harness.phase(env) as m:
            # With a run folder each train() ends with a checkpoint (on the GPU: its CPU copy is host RAM). On
            # the CPU the steps' device bytes are measured tensor by tensor: a checkpoint there is not training.
            trainer = Trainer(components, cached, lora, optimizer, train_cfg,
                              run_dir=workdir / "runs" / f"k{k}" if cuda else None)
        row(label, k, "init", m, plan)
        running["phase"] = "train"
        with harness.phase(env) as m:
            resident = 0 if cuda else common.resident_bytes(trainer)
            with LiveBytes() if not cuda else contextlib.nullcontext() as live:
                first = trainer.train(1)
                after_one = probe_lora(trainer, probe_blocks)
                rest = trainer.train(env.steps - 1)
            if not cuda:  # no allocator statistics: the device's bytes are the resident tensors + the steps' new ones
                m.gpu_allocated = resident + live.peak
        row(label, k, "train", m, plan)
        losses = first.losses + rest.losses
        running["phase"] = "preview"
        with harness.phase(env) as m:
            image = sample_image(components, cached, "a red bicycle", "blurry", side, side, steps=PREVIEW_STEPS,
                                 cfg_scale=4.0, seed=0)
        row(label, k, "preview", m, plan)
        pixels = np.asarray(image, dtype=np.float32)
        report.check(f"{label}: preview", image.size == (side, side) and bool(np.isfinite(pixels).all()),
                     f"{image.size[0]}x{image.size[1]}, mean {pixels.mean():.1f}")
        running["phase"] = "save"
        with harness.phase(env) as m:
            path = trainer.save_lora(workdir / f"lora_{k}.safetensors")
        row(label, k, "save", m, plan)
        saved = read_lora_file(path)
        results[label] = (losses, after_one, probe_lora(trainer, probe_blocks), rest.step_seconds)
        report.check(f"{label}: LoRA file", sorted(saved.targets) == sorted(trainer.decided.modules),
                     f"{len(saved.targets)} modules, rank {saved.rank}; losses {losses[0]:.4f} -> {losses[-1]:.4f}; "
                     f"{rest.step_seconds:.2f} s/step over steps 2..{env.steps}")
        trainer.close()
        del trainer

    per_setting = None
    for i, (label, k, budget) in enumerate(settings):
        started = clock.elapsed()
        if per_setting is not None and left() < per_setting:
            report.cut_phase(f"memory: {label}", f"{left():.0f} s left of the memory slice, a setting took "
                             f"{per_setting:.0f} s")
            continue
        out_of_memory = None
        try:
            with harness.card_of(env, budget):
                one_setting(label, k, budget)
        except torch.cuda.OutOfMemoryError as e:
            out_of_memory = str(e).splitlines()[0][:200]
        if out_of_memory is not None:  # (here, where the error's frames, the half-built trainer's, are gone)
            report.check(f"{label} {running['phase']}: runs under its card's cap", False,
                         f"out of memory in the {running['phase']} phase: {out_of_memory}")
            gc.collect()
            torch.cuda.empty_cache()
        if budget is not None and cuda:
            peak = max((r["_raw"][0].gpu_total for r in rows if r["setting"] == label), default=0)
            report.check(f"{label} within its budget", peak <= budget,
                         f"{peak / GIB:.2f} of {budget / GIB:.2f} GiB at its largest phase")
        per_setting = clock.elapsed() - started

    again = None
    if "all resident" in results and left() > (per_setting or 0) / 4:
        # The run-to-run floor: the all-resident step once more, from the same seed and batches.
        trainer = Trainer(components, cached, lora, optimizer, planned(0)[0])
        trainer.train(1)
        again = probe_lora(trainer, probe_blocks)
        trainer.close()
        del trainer
    memory_checks(env, report, rows)
    streaming_checks(report, results, again)
    for r in rows:
        r.pop("_raw")


def memory_checks(env: Env, report: Report, rows: list[dict]) -> None:
    for r in rows:
        m, planned_gpu, planned_alloc, planned_host = r["_raw"]
        name = f"{r['setting']} {r['phase']}"
        if env.cuda:
            # A phase that plans no GPU use (loading reads headers) plans no context either: torch's share counts.
            used = m.gpu_total if planned_gpu else m.gpu_total - m.gpu_outside
            report.check(f"{name}: GPU within plan", used <= planned_gpu,
                         f"{used / GIB:.2f} of {planned_gpu / GIB:.2f} GiB (reserved + outside torch)")
            if m.gpu_allocated:
                report.check(f"{name}: GPU allocated within plan", m.gpu_allocated <= planned_alloc,
                             f"{m.gpu_allocated / GIB:.3f} of {planned_alloc / GIB:.3f} GiB "
                             f"({m.gpu_allocated / max(planned_alloc, 1) - 1:+.1%})")
            report.check(f"{name}: host RAM within plan", m.host <= planned_host,
                         f"{m.host / GIB:.2f} of {planned_host / GIB:.2f} GiB")
        if r["phase"] == "train":  # on the CPU: the 4-block model's device bytes, measured tensor by tensor
            ratio = planned_alloc / max(m.gpu_allocated, 1)
            limit = 1.15 if env.cuda else 1.05
            report.check(f"{r['setting']} train: plan within {limit - 1:.0%} of allocated", 1.0 <= ratio <= limit,
                         f"planned / measured = {ratio:.3f}")


def streaming_checks(report: Report, results: dict, again: dict[str, torch.Tensor] | None = None) -> None:
    """Every streamed setting against the all-resident one: the first loss, and the LoRA after one step (`again`: the
    LoRA after a second all-resident step, the run-to-run floor)."""
    rows = report.table("streaming correctness", ["setting", "first_loss", "resident_first_loss",
                                                  "lora_after_one_step_relative_difference", "bit_for_bit"])
    if "all resident" not in results or len(results) < 2:
        report.cut_phase("streaming correctness", "the all-resident setting or every streamed one was cut for time")
        return
    losses0, one0, end0, _ = results["all resident"]
    floor, floor_exact = relative_difference(again, one0) if again is not None else (0.0, True)
    if again is not None:
        rows.append(dict(setting="all resident, a second time", first_loss=None, resident_first_loss=None,
                         lora_after_one_step_relative_difference=f"{floor:.2e}", bit_for_bit=floor_exact))
    for label, (losses, one, end, _) in results.items():
        if label == "all resident":
            continue
        diff, exact = relative_difference(one, one0)
        rows.append(dict(setting=label, first_loss=round(losses[0], 6), resident_first_loss=round(losses0[0], 6),
                         lora_after_one_step_relative_difference=f"{diff:.2e}", bit_for_bit=exact))
        def close(i: int) -> bool:
            return (len(losses) > i and len(losses0) > i and math.isfinite(losses[i])
                    and abs(losses[i] - losses0[i]) <= STREAMING_TOLERANCE * abs(losses0[i]))

        # The losses, not the LoRA after the step (see STREAMING_TOLERANCE); that difference is reported beside.
        after = (f"{losses[1]:.6f} vs {losses0[1]:.6f}" if len(losses) > 1 and len(losses0) > 1
                 else "not run (one step)")
        report.check(f"{label}: one streamed step equals the all-resident step", close(0) and close(1),
                     f"first loss {losses[0]:.6f} vs {losses0[0]:.6f}; loss after the step {after} (tolerance "
                     f"{STREAMING_TOLERANCE:g} of the loss); LoRA B after the step {diff:.2e} of its norm apart "
                     f"({'bit for bit' if exact else 'not bit for bit'}; a second resident step: {floor:.2e})")
        end_diff, _ = relative_difference(end, end0)
        report.note(f"{label}: LoRA B after all steps differs from all-resident by {end_diff:.2e} of its norm")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(parser, str(Path(__file__).resolve().parent / "gpu_check_out"))
    parser.add_argument("--workdir", default=None, help="where the model files go (default: a temporary folder)")
    parser.add_argument("--keep-files", action="store_true", help="keep --workdir's files")
    args = parser.parse_args(argv)
    env = harness.make_env(args, "gpu_check.py")
    report = Report(f"GPU check: memory per phase ({'tiny, CPU' if env.tiny else 'real-size Qwen-Image'})", env,
                    "python benchmarks/gpu_check.py" + (" --tiny" if env.tiny else ""))
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="qwen_gpu_check_"))
    try:
        run_memory(env, report, harness.Clock(args.seconds), workdir)
    finally:
        if not args.keep_files:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if report.write(args.out, "gpu_check").startswith("VERDICT: PASS") else 1


if __name__ == "__main__":
    raise SystemExit(main())
