"""Train the small pretrained Qwen-Image shipped in pretrained/qwen_image_shapes/ (trainer_core/models/pretrained.py).

    OMP_NUM_THREADS=1 nice -n 15 python tools/train_shapes_model.py   # the shipped weights (run time: benchmarks/README.md)
    python tools/train_shapes_model.py --out /tmp/m --vae-steps 2 --steps 2 --images 16   # a short run (tests)

Everything comes from --seed: the pictures (trainer_core/shapes.py), the initial weights and every draw of the
training loops (seeded generators, one torch thread), so a run writes the same bytes every time. The two phases
draw from generators of their own, so `--vae-from DIR` (the VAE file an earlier run of the same seed and VAE
settings wrote into DIR: the very weights this run would train) skips the first phase and writes the same files.

1. VAE (`AutoencoderKLQwenImage`, small config): pixel MSE (the shape's pixels weighted up) on half-size pictures
   of all four shapes,
   the star included: a codec should encode anything; only the transformer must not know stars.
2. The VAE and the text encoder are rounded to bf16 (what the files hold), so the transformer trains on exactly
   the latents and prompt features the shipped files give; the VAE's per-channel latent mean and std over the
   training pictures go into its config (latents_mean / latents_std), as Qwen-Image's VAE config has them.
3. Transformer: the flow-matching objective of the LoRA trainer (trainer_core/training/objective.py: logit-normal levels
   shifted for 64 tokens, velocity target) on the latents of `--images` pictures of circles, squares and triangles
   and the embeddings of their captions (10% empty, so classifier-free guidance works); AdamW with warm-up and a
   cosine decay; an exponential moving average of the weights is what is written.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer_core.devtools import shapes  # noqa: E402
from trainer_core.models.part_files import public_config, write_part_file  # noqa: E402
from trainer_core.core.files import write_bytes_atomic  # noqa: E402
from trainer_core.models.latents import pack_latents  # noqa: E402
from trainer_core.models.pretrained import SHIPPED_DIR, build_untrained, shipped_files  # noqa: E402
from trainer_core.models.scheduler import QWEN_IMAGE_SCHEDULER_CONFIG  # noqa: E402
from trainer_core.models.text import encode_prompts, pad_prompt_batch  # noqa: E402
from trainer_core.models.text_encoder_file import text_encoder_file_tensors  # noqa: E402
from trainer_core.models.transformer_file import transformer_file_tensors  # noqa: E402
from trainer_core.models.vae_file import load_vae_file, vae_file_tensors  # noqa: E402
from trainer_core.training.objective import (  # noqa: E402
    flow_loss, noisy_latents, resolution_mu, sample_noise_levels, velocity_target)

CAPTION_DROPOUT = 0.1
# The VAE trains as a plain autoencoder on its distribution's mode (the latent every encode here uses): sampling
# from its initial unit variance buried the first hundreds of steps in noise. A small penalty on the latents'
# size stands in for the KL term (their scale is normalised away by latents_mean / latents_std anyway).
LATENT_WEIGHT = 1e-4
VAE_LR = 1e-3


def pictures(scenes, size: int = shapes.SIZE) -> torch.Tensor:
    """(N, 3, size, size) in [-1, 1]."""
    arrays = np.stack([np.asarray(shapes.draw(s, size), dtype=np.float32) for s in scenes])  # (N, H, W, 3)
    return torch.from_numpy(arrays).permute(0, 3, 1, 2) / 127.5 - 1.0


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def round_to_bf16(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def train_vae(vae, steps: int, batch: int, rng: random.Random, log) -> list[float]:
    """The VAE on half-size pictures (32x32, every length halved: a quarter of the cost; the VAE is convolutional,
    so it codes the 64x64 pictures as well), with the shape's pixels weighted 10x in the MSE: the background is
    90% of a picture and is learned first, the shape's colour much later otherwise (measured: grey shapes after
    300 steps of plain MSE)."""
    opt = torch.optim.AdamW(vae.parameters(), lr=VAE_LR, weight_decay=0.0)
    vae.train().requires_grad_(True)
    losses = []
    half = shapes.SIZE // 2
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, VAE_LR, warmup=min(20, steps))
        scenes = [shapes.random_scene(rng, shapes.TRAINED_SHAPES + (shapes.NEW_SHAPE,)) for _ in range(batch)]
        scenes = [dataclasses.replace(s, radius=s.radius / 2, dx=s.dx / 2, dy=s.dy / 2) for s in scenes]
        x = pictures(scenes, half).unsqueeze(2)  # (B, 3, 1, H, W): the VAE works on frames
        z = vae.encode(x).latent_dist.mode()  # (B, C, 1, h, w): what encode_images gives the trainer
        recon = decode_unclamped(vae, z)
        shape_pixels = ((x - x[..., :1, :1]).abs().sum(1, keepdim=True) > 0.1).float()  # a corner is background
        loss = ((1.0 + 9.0 * shape_pixels) * (recon - x) ** 2).mean() + LATENT_WEIGHT * z.pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        # Without clipping, Adam at this rate blew up after ~100 steps (a loss of 0.16 jumped to 0.8) and the
        # codec never left its blurred-background plateau; clipped, 8 pictures were learned in 300 steps.
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            log(f"vae step {step:5d}  loss {loss.item():.5f}")
    vae.eval().requires_grad_(False)
    return losses


def decode_unclamped(vae, z: torch.Tensor) -> torch.Tensor:
    """`vae.decode(z)` of one frame (B, C, 1, h, w) -> (B, 3, 1, H, W) without its final clamp to [-1, 1]: a
    clamped pixel on the wrong side of a background (+1 predicted for a black one) would get no gradient."""
    vae.clear_cache()
    vae._conv_idx = [0]
    out = vae.decoder(vae.post_quant_conv(z), feat_cache=vae._feat_map, feat_idx=vae._conv_idx)
    vae.clear_cache()
    return out


@torch.no_grad()
def reconstructions_read_back(vae, rng: random.Random, count: int = 60) -> float:
    """Share of fresh 64x64 pictures (all four shapes) whose encode -> decode round trip `shapes.measure` reads
    as the scene drawn: the codec's own check, before any transformer trains on its latents."""
    scenes = [shapes.random_scene(rng, shapes.TRAINED_SHAPES + (shapes.NEW_SHAPE,)) for _ in range(count)]
    x = pictures(scenes).unsqueeze(2)  # (N, 3, 1, H, W)
    decoded = vae.decode(vae.encode(x).latent_dist.mode()).sample[:, :, 0]  # (N, 3, H, W) in [-1, 1]
    hits = 0
    for scene, picture in zip(scenes, decoded):
        array = ((picture.permute(1, 2, 0).numpy() + 1.0) * 127.5).round().clip(0, 255).astype(np.uint8)
        m = shapes.measure(Image.fromarray(array), scene.background)
        hits += (m.shape, m.colour, m.place) == (scene.shape, scene.colour, scene.place)
    return hits / count


@torch.no_grad()
def encode_raw(vae, images: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """(N, 3, H, W) -> unnormalised latents (N, C, H/4, W/4), distribution mode."""
    return torch.cat([vae.encode(images[i:i + batch].unsqueeze(2)).latent_dist.mode()[:, :, 0]
                      for i in range(0, len(images), batch)])


def write_model(folder: Path, transformer, vae, text_encoder, tokenizer) -> None:
    files = shipped_files(folder)
    write_part_file(transformer_file_tensors(transformer, "bf16"), files["transformer"], "transformer", "bf16",
                    public_config(transformer.config))
    write_part_file(text_encoder_file_tensors(text_encoder, "bf16"), files["text_encoder"], "text encoder", "bf16",
                    text_encoder.config.to_dict())
    write_part_file(vae_file_tensors(vae), files["vae"], "vae", "bf16", public_config(vae.config))
    tokenizer.save_pretrained(str(files["tokenizer"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=SHIPPED_DIR)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vae-steps", type=int, default=3000)
    parser.add_argument("--vae-batch", type=int, default=16)
    parser.add_argument("--images", type=int, default=1500, help="training pictures of the transformer")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--vae-check", type=int, default=60,
                        help="fresh pictures the trained VAE's round trip is measured on (training.json)")
    parser.add_argument("--save-every", type=int, default=0, help="also write the files every N transformer steps")
    parser.add_argument("--vae-from", type=Path, default=None,
                        help="take the VAE from the files an earlier run of the same --seed and VAE settings wrote")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.time()

    def log(text: str) -> None:
        print(f"[{time.time() - started:7.1f} s] {text}", flush=True)

    gen = torch.Generator().manual_seed(args.seed)
    transformer, vae, text_encoder, tokenizer = build_untrained(args.seed)
    if args.vae_from is None:
        vae_losses = train_vae(vae, args.vae_steps, args.vae_batch, random.Random(args.seed), log)
    else:  # the bf16 file holds exactly the rounded weights below
        vae_losses = []
        vae.load_state_dict(load_vae_file(shipped_files(args.vae_from)["vae"], torch.float32).state_dict())
        log(f"vae from {args.vae_from}")
    round_to_bf16(vae)
    round_to_bf16(text_encoder)
    vae_seconds = time.time() - started
    vae_read_back = reconstructions_read_back(vae, random.Random(args.seed + 1000), args.vae_check)
    log(f"vae: {vae_read_back:.0%} of held-out pictures read back as the shape, colour and place they show")

    rng = random.Random(args.seed + 1)  # the transformer phase's pictures: its own generator (see --vae-from)
    scenes = [shapes.random_scene(rng) for _ in range(args.images)]
    raw = encode_raw(vae, pictures(scenes))  # (N, C, 16, 16)
    mean, std = raw.mean(dim=(0, 2, 3)), raw.std(dim=(0, 2, 3))  # (C,) each
    # Rounded like every other value the files hold (JSON keeps them exactly as these floats).
    vae.register_to_config(latents_mean=[round(float(m), 6) for m in mean],
                           latents_std=[round(float(s), 6) for s in std])
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1)
    latents = (raw - mean) / std  # (N, C, h, w), about unit variance per channel
    h, w = latents.shape[-2:]
    grid = (h // 2, w // 2)
    captions = sorted({s.caption for s in scenes})
    embeds = dict(zip(captions + [""], encode_prompts(text_encoder, tokenizer, captions + [""])))  # each (L, 16)
    log(f"vae done ({vae_seconds:.0f} s); {len(scenes)} pictures, {len(captions)} captions, "
        f"latents {tuple(latents.shape)}")

    mu = resolution_mu(grid[0] * grid[1], QWEN_IMAGE_SCHEDULER_CONFIG)
    transformer.train().requires_grad_(True)
    params = [p for p in transformer.parameters()]
    ema = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    losses = []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, warmup=min(100, args.steps))
        index = torch.randint(len(scenes), (args.batch,), generator=gen)
        drop = torch.rand(args.batch, generator=gen) < CAPTION_DROPOUT
        text, mask = pad_prompt_batch([embeds["" if d else scenes[i].caption] for i, d in zip(index.tolist(), drop)])
        x0 = latents[index]  # (B, C, h, w)
        levels = sample_noise_levels(args.batch, gen, "logit_normal", mu=mu)  # (B,)
        noise = torch.randn(x0.shape, generator=gen)
        prediction = transformer(hidden_states=pack_latents(noisy_latents(x0, noise, levels)),
                                 encoder_hidden_states=text, encoder_hidden_states_mask=mask, timestep=levels,
                                 img_shapes=[[(1, *grid)]] * args.batch, return_dict=False)[0]  # (B, N, 4C)
        loss = flow_loss(prediction, pack_latents(velocity_target(x0, noise)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        decay = min(0.999, (1 + step) / (10 + step))
        with torch.no_grad():
            for e, p in zip(ema, params):
                e.lerp_(p.detach(), 1.0 - decay)
        losses.append(loss.item())
        if step % 100 == 0 or step == args.steps - 1:
            log(f"step {step:5d}  loss {np.mean(losses[-100:]):.4f}  lr {opt.param_groups[0]['lr']:.2e}")
        if args.save_every and (step + 1) % args.save_every == 0 and step + 1 < args.steps:
            save(args, transformer, ema, vae, text_encoder, tokenizer, vae_losses, vae_read_back, losses, started,
                 vae_seconds, log)
    save(args, transformer, ema, vae, text_encoder, tokenizer, vae_losses, vae_read_back, losses, started, vae_seconds,
         log)
    return 0


def save(args, transformer, ema, vae, text_encoder, tokenizer, vae_losses, vae_read_back, losses, started,
         vae_seconds, log) -> None:
    shipped = copy.deepcopy(transformer).eval().requires_grad_(False)
    with torch.no_grad():
        for p, e in zip(shipped.parameters(), ema):
            p.copy_(e)
    write_model(args.out, shipped, vae, text_encoder, tokenizer)
    record = {"seed": args.seed, "vae_from": str(args.vae_from) if args.vae_from else None, "vae_steps": args.vae_steps, "vae_batch": args.vae_batch, "images": args.images,
              "steps": args.steps, "steps_done": len(losses), "batch": args.batch, "lr": args.lr,
              "vae_loss_last50": float(np.mean(vae_losses[-50:])) if vae_losses else None,
              "vae_read_back": vae_read_back,
              "loss_first100": float(np.mean(losses[:100])), "loss_last100": float(np.mean(losses[-100:])),
              "seconds_vae": round(vae_seconds, 1), "seconds_total": round(time.time() - started, 1),
              "threads": torch.get_num_threads()}
    write_bytes_atomic(json.dumps(record, indent=2).encode(), args.out / "training.json")
    log(f"wrote {args.out} at step {len(losses)}")


if __name__ == "__main__":
    raise SystemExit(main())
