"""Does a Qwen-Image 2.1 LoRA learn transparency? (issue 41, item 1)

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/transparency21.py [--vae-steps 1500] [--steps 300] [--out DIR]

1. A small 2.1 model trained here as the shipped shapes model was (tools/train_shapes_model.py), diffusers' 2.1
   classes throughout: the tiny 2.1 set's RGBA VAE (families/qwen_image21/tiny.py) trained on shapes pictures of which
   half lie on a transparent background (pixel MSE over the four channels, the shape's pixels weighted up, gradients
   clipped; its latents' per-channel mean and std into its config; `--vae-cache` keeps it for the next run); then a
   transformer of 4 blocks at width 128 (the shapes model's size; the tiny Qwen3-VL as its text encoder) trained on
   --base-images opaque pictures of circles, squares and triangles on white or black: with our Trainer as a rank-64
   LoRA on every Linear, merged into its weights after (the Trainer trains adapters only).
2. Eight star pictures on a transparent background (shapes.STAR_SCENES drawn in RGBA, 64 px) with their captions.
3. Two LoRA runs on the same pictures with the same seed and settings (rank 16 on every Linear, AdamW 2e-3, 2 pictures
   a step), which differ only in the Dataset's transparency: "keep" (2.1's default now) and "flatten" (composited onto
   white: what every 2.1 run did before).
4. Previews (the pinned QwenImage21Pipeline through our sampler: 20 steps, CFG 1, 64 px, RGBA) of the eight captions at
   seed 0, before training and after each run. Measured on each preview: the mean alpha (0-1) of the background
   pixels (farther than 1.5 star radii from the star's centre) and of the star's core (within 0.3 radii).

Prints one JSON line per phase and a table; writes the previews (RGBA PNGs and a checkerboard sheet) into --out.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)
import numpy as np
import torch
from PIL import Image, ImageDraw

from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.data.cache import build_cache
from trainer_core.data.images import discover
from trainer_core.data.pixels import on_checkerboard
from trainer_core.devtools import shapes
from trainer_core.families import get_family
from trainer_core.training import Trainer

SIZE = 64
BACKGROUND_RADII = 1.5  # pixels farther than this many star radii from its centre are background
CORE_RADII = 0.3  # pixels within this many radii are the star's core
VAE_LR = 1e-3


def draw_rgba(scene: shapes.Scene, transparent: bool, size: int = SIZE) -> Image.Image:
    """`scene` drawn at 4x and reduced (premultiplied, so edges are half-transparent, not dark): on a transparent
    background, or on its own opaque one."""
    scale = 4
    back = (0, 0, 0, 0) if transparent else (*shapes.BACKGROUNDS[scene.background], 255)
    big = Image.new("RGBA", (size * scale, size * scale), back)
    pen = ImageDraw.Draw(big)
    fx, fy = shapes.PLACES[scene.place]
    cx, cy, r = (fx * size + scene.dx) * scale, (fy * size + scene.dy) * scale, scene.radius * scale
    outline = shapes.shape_outline(scene.shape, cx, cy, r)
    fill = (*shapes.COLOURS[scene.colour], 255)
    if outline is None:
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    else:
        pen.polygon(outline, fill=fill)
    return big.resize((size, size), Image.Resampling.BOX)


def as_tensor(images: list[Image.Image]) -> torch.Tensor:
    """RGBA pictures -> (N, 4, H, W) in [-1, 1]."""
    return torch.from_numpy(np.stack([np.asarray(i, dtype=np.float32) for i in images])).permute(0, 3, 1, 2) / 127.5 - 1


def train_vae(vae, steps: int, batch: int, rng: random.Random, log) -> float:
    """The RGBA VAE as an autoencoder on its distribution's mode, half the pictures transparent; the shape's pixels
    (alpha or colour away from a corner's) weigh 10x. Returns the mean loss of the last 50 steps."""
    opt = torch.optim.AdamW(vae.parameters(), lr=VAE_LR, weight_decay=0.0)
    vae.train().requires_grad_(True)
    losses = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = VAE_LR * min(1.0, (step + 1) / 20)
        scenes = [shapes.random_scene(rng, shapes.TRAINED_SHAPES + (shapes.NEW_SHAPE,)) for _ in range(batch)]
        x = as_tensor([draw_rgba(s, transparent=i % 2 == 0) for i, s in enumerate(scenes)]).unsqueeze(2)
        z = vae.encode(x).latent_dist.mode()  # (B, C, 1, h, w)
        recon = vae.decode(z).sample  # (B, 4, 1, H, W), clamped to [-1, 1] as every decode is
        shape_pixels = ((x - x[..., :1, :1]).abs().sum(1, keepdim=True) > 0.1).float()
        loss = ((1.0 + 9.0 * shape_pixels) * (recon - x) ** 2).mean() + 1e-4 * z.pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == steps - 1:
            log(f"vae step {step:5d}  loss {np.mean(losses[-50:]):.5f}")
    vae.eval().requires_grad_(False)
    with torch.no_grad():  # its latents' statistics, as the shipped VAE configs hold them
        scenes = [shapes.random_scene(rng) for _ in range(256)]
        raw = vae.encode(as_tensor([draw_rgba(s, i % 2 == 0) for i, s in enumerate(scenes)]).unsqueeze(2)
                         ).latent_dist.mode()[:, :, 0]  # (N, C, h, w)
    vae.register_to_config(latents_mean=[float(m) for m in raw.mean(dim=(0, 2, 3))],
                           latents_std=[float(s) for s in raw.std(dim=(0, 2, 3))])
    return float(np.mean(losses[-50:]))


def star_pictures(folder: Path) -> list[shapes.Scene]:
    folder.mkdir(parents=True, exist_ok=True)
    for n, scene in enumerate(shapes.STAR_SCENES):
        draw_rgba(scene, transparent=True).save(folder / f"{n:02d}.png")
        (folder / f"{n:02d}.txt").write_text(scene.caption)
    return list(shapes.STAR_SCENES)


def alpha_measure(image: Image.Image, scene: shapes.Scene) -> tuple[float, float]:
    """(mean alpha of the background pixels, of the star's core), 0-1."""
    alpha = np.asarray(image.convert("RGBA"), dtype=np.float64)[..., 3] / 255.0  # (H, W)
    fx, fy = shapes.PLACES[scene.place]
    cx, cy = fx * image.width + scene.dx, fy * image.height + scene.dy
    ys, xs = np.mgrid[0:image.height, 0:image.width]
    distance = np.hypot(xs + 0.5 - cx, ys + 0.5 - cy) / scene.radius
    return float(alpha[distance > BACKGROUND_RADII].mean()), float(alpha[distance < CORE_RADII].mean())


def previews(trainer: Trainer, scenes, out: Path, name: str, sample_steps: int = 20) -> dict:
    images = [trainer.sample_preview(s.caption, "", SIZE, SIZE, sample_steps, 1.0, 0) for s in scenes]
    sheet = Image.new("RGB", (SIZE * len(images), SIZE))
    for i, (image, scene) in enumerate(zip(images, scenes)):
        image.save(out / f"{name}_{i:02d}.png")
        sheet.paste(on_checkerboard(image), (i * SIZE, 0))
    sheet.resize((sheet.width * 2, sheet.height * 2), Image.Resampling.NEAREST).save(out / f"{name}_sheet.png")
    measured = [alpha_measure(image, scene) for image, scene in zip(images, scenes)]
    return {"mode": images[0].mode, "background_alpha": round(float(np.mean([b for b, _ in measured])), 3),
            "star_core_alpha": round(float(np.mean([c for _, c in measured])), 3)}


def small_components(seed: int, vae_cache: Path | None, vae_steps: int, vae_batch: int, log):
    """The tiny 2.1 set with the VAE trained here (or read from `vae_cache`) and a transformer of the shapes model's
    size (4 blocks, width 128), random."""
    from diffusers import QwenImage21Transformer2DModel

    components = get_family("qwen-image-2.1").tiny_components(seed=seed, storage="float32")
    if vae_cache is not None and vae_cache.exists():
        saved = torch.load(vae_cache)
        components.vae.load_state_dict(saved["state"])
        components.vae.register_to_config(latents_mean=saved["mean"], latents_std=saved["std"])
        log(f"vae from {vae_cache}")
        vae_loss = saved["loss"]
    else:
        vae_loss = train_vae(components.vae, vae_steps, vae_batch, random.Random(seed), log)
        if vae_cache is not None:
            torch.save({"state": components.vae.state_dict(), "mean": components.vae.config.latents_mean,
                        "std": components.vae.config.latents_std, "loss": vae_loss}, vae_cache)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 10)
        components.transformer = QwenImage21Transformer2DModel(
            patch_size=1, in_channels=components.vae.config.z_dim, out_channels=components.vae.config.z_dim,
            num_layers=4, attention_head_dim=32, num_attention_heads=4, context_in_dim=16, mlp_ratio=3,
            axes_dims_rope=(8, 12, 12)).requires_grad_(False).eval()
    return components, vae_loss


@torch.no_grad()
def vae_round_trip(vae, out: Path, seed: int) -> dict:
    """Eight fresh transparent pictures through the VAE and back: a sheet, and the alpha the round trip gives their
    background and their shape (the codec's own share of the measure below)."""
    from trainer_core.models.latents import decode_latents, encode_images

    scenes = [shapes.random_scene(random.Random(seed + 100 + i)) for i in range(8)]
    pictures = [draw_rgba(s, transparent=True) for s in scenes]
    decoded = decode_latents(vae, encode_images(vae, as_tensor(pictures)))  # (8, 4, H, W) in [-1, 1]
    images = [Image.fromarray(((d.permute(1, 2, 0).numpy() + 1) * 127.5).round().clip(0, 255).astype(np.uint8), "RGBA")
              for d in decoded]
    sheet = Image.new("RGB", (SIZE * 8, SIZE * 2))
    for i, (a, b) in enumerate(zip(pictures, images)):
        sheet.paste(on_checkerboard(a), (i * SIZE, 0))
        sheet.paste(on_checkerboard(b), (i * SIZE, SIZE))
    sheet.resize((sheet.width * 2, sheet.height * 2), Image.Resampling.NEAREST).save(out / "vae_round_trip.png")
    measured = [alpha_measure(i, s) for i, s in zip(images, scenes)]
    return {"background_alpha": round(float(np.mean([b for b, _ in measured])), 3),
            "shape_core_alpha": round(float(np.mean([c for _, c in measured])), 3)}


def train_base(components, out: Path, images: int, steps: int, seed: int, log) -> dict:
    """The transformer taught the opaque shapes (step 1 of the module docstring), the LoRA merged into it."""
    from peft.tuners.lora import LoraLayer

    from trainer_core.core.config import DatasetConfig

    folder = out / "base_pictures"
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed + 1)
    for n in range(images):
        scene = shapes.random_scene(rng)
        draw_rgba(scene, transparent=False).convert("RGB").save(folder / f"{n:04d}.png")
        (folder / f"{n:04d}.txt").write_text(scene.caption)
    cfg = DatasetConfig(folder=str(folder), resolution=SIZE, min_bucket_side=32, max_bucket_side=128)
    components.ensure_text_encoder()
    cached = build_cache(components, discover(cfg), out / "cache")
    trainer = Trainer(components, cached, LoraConfig(rank=64, alpha=64.0, targets="all"),
                      OptimizerConfig(optimizer="adamw", learning_rate=1e-3, schedule="cosine"),
                      TrainConfig(run_name="transparency-base", seed=seed, micro_batch_size=8, blocks_to_swap=0,
                                  gradient_checkpointing=False, caption_dropout=0.1))
    try:
        report = trainer.train(steps)
        for module in trainer.built.transformer.modules():
            if isinstance(module, LoraLayer):
                module.merge()  # into the base weights, which stay when the Trainer takes its adapter out
    finally:
        trainer.close()
    log(f"base: {steps} steps, loss {np.mean(report.losses[:50]):.4f} -> {np.mean(report.losses[-50:]):.4f}")
    return {"phase": "base", "images": images, "steps": steps, "loss_first50": round(float(np.mean(report.losses[:50])), 4),
            "loss_last50": round(float(np.mean(report.losses[-50:])), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vae-steps", type=int, default=1500)
    parser.add_argument("--vae-batch", type=int, default=8)
    parser.add_argument("--base-images", type=int, default=400)
    parser.add_argument("--base-steps", type=int, default=1500)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--vae-cache", type=Path, default=None, help="a file the trained VAE is kept in (and read from)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample-steps", type=int, default=20, help="sampling steps of each preview")
    parser.add_argument("--out", default=None, help="where the previews go (default: a temporary folder)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="transparency21_"))
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    started = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {text}", flush=True)

    from trainer_core.core.config import DatasetConfig

    components, vae_loss = small_components(args.seed, args.vae_cache, args.vae_steps, args.vae_batch, log)
    print(json.dumps({"phase": "vae", "steps": args.vae_steps, "loss_last50": round(vae_loss, 5),
                      "round_trip": vae_round_trip(components.vae, out, args.seed),
                      "seconds": round(time.perf_counter() - started, 1)}), flush=True)
    print(json.dumps({**train_base(components, out, args.base_images, args.base_steps, args.seed, log),
                      "seconds": round(time.perf_counter() - started, 1)}), flush=True)
    scenes = star_pictures(out / "stars")
    results = {}
    for transparency in ("keep", "flatten"):
        cfg = DatasetConfig(folder=str(out / "stars"), resolution=SIZE, min_bucket_side=32, max_bucket_side=128,
                            transparency=transparency)
        components.ensure_text_encoder()
        cached = build_cache(components, discover(cfg), out / "cache",
                             preview_prompts=[s.caption for s in scenes])
        trainer = Trainer(components, cached, LoraConfig(rank=16, alpha=16.0, targets="all"),
                          OptimizerConfig(optimizer="adamw", learning_rate=2e-3, schedule="constant"),
                          TrainConfig(run_name=f"transparency-{transparency}", seed=args.seed, micro_batch_size=2,
                                      blocks_to_swap=0, gradient_checkpointing=False))
        try:
            if "before" not in results:
                results["before"] = previews(trainer, scenes, out, "before", args.sample_steps)
                print(json.dumps({"phase": "before", **results["before"]}), flush=True)
            report = trainer.train(args.steps)
            results[transparency] = {**previews(trainer, scenes, out, f"after_{transparency}", args.sample_steps),
                                     "loss_first20": round(float(np.mean(report.losses[:20])), 4),
                                     "loss_last20": round(float(np.mean(report.losses[-20:])), 4)}
            print(json.dumps({"phase": f"after, transparency {transparency}", **results[transparency],
                              "seconds": round(time.perf_counter() - started, 1)}), flush=True)
        finally:
            trainer.close()
    print("\n| previews of the 8 star captions (seed 0) | background alpha | star core alpha |\n|---|---:|---:|")
    for key, label in (("before", "before training"), ("keep", "after 'keep' (2.1's default)"),
                       ("flatten", "after 'flatten'")):
        print(f"| {label} | {results[key]['background_alpha']} | {results[key]['star_core_alpha']} |")
    print(f"previews: {out}")


if __name__ == "__main__":
    main()
