"""Measure the no-grad working memory the phase planner uses (`trainer_core/planner/inference.py`) and print
its constants: a preview's denoising forward, the VAE's encode and decode, the text encoder's forward.

    OMP_NUM_THREADS=2 .venv/bin/python tools/calibrate_preview.py     # ~2 min, ~2.5 GB of RAM

All three are peaks of live bytes above the inputs (`memprobe.LiveBytes`), in bf16, on the CPU:
- one transformer block's forward without gradients (eval mode, LoRA on, Linears in bf16: the planner adds
  the float8 upcast as its own term), per joint token (image + text) and unit of MLP width F, at 2 and 4
  heads (the ratio is width-independent) and at the 1024 x 1024 proportions (64 x 64 image tokens, 256
  text tokens; a text-heavy 16 x 16 + 512 gives a lower ratio per joint token, so the table is safe);
- the real Qwen-Image VAE (diffusers' `AutoencoderKLQwenImage` defaults) encoding and decoding one frame at
  256 and 512 px square: the peak is linear in pixels (the slope is printed), and proportional to the VAE's
  base channel width (checked at base_dim 48), hence bytes per pixel per base channel;
- the Qwen2.5-VL language model (real layout, narrow widths, few layers) encoding one prompt with all
  hidden states kept (as `models.text.encode_prompts` does): per token, 3 x layers x hidden (the hidden
  states, kept, and the residual stream) + 3 x intermediate x 2 bytes (the MLP's transients) + a remainder
  that does not grow with the width, printed here.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def block_forward_peak(heads: int, grid: int, text: int, preset: str, dtype: str) -> tuple[int, int]:
    """(peak bytes, F) of one block's no-grad forward with a LoRA, eval mode, bf16."""
    import torch

    from trainer_core.core.config import LoraConfig
    from trainer_core.devtools.memprobe import LiveBytes
    from trainer_core.devtools.random_weights import random_transformer
    from trainer_core.adapters.lora import inject_lora
    from trainer_core.planner.arch import arch_from_transformer

    model = random_transformer(dict(num_layers=2, num_attention_heads=heads), storage="bfloat16")
    arch = arch_from_transformer(model)
    inject_lora(model, LoraConfig(rank=4, alpha=4.0, targets=preset, dtype=dtype), seed=0)
    model.eval()
    g = torch.Generator().manual_seed(0)
    image = torch.randn(1, grid * grid, arch.dim, generator=g).bfloat16()  # (B, N_img, D)
    prompt = torch.randn(1, text, arch.dim, generator=g).bfloat16()  # (B, N_txt, D)
    temb = torch.randn(1, arch.dim, generator=g).bfloat16()  # (B, D)
    rope = model.pos_embed([(1, grid, grid)], max_txt_seq_len=text, device="cpu")
    with torch.no_grad(), LiveBytes() as live:
        out = model.transformer_blocks[0](image, prompt, None, temb, rope)
        del out
    return live.peak, arch.mlp_dim


def vae_peaks(base_dim: int, side: int) -> tuple[int, int]:
    """(encode peak, decode peak) of the Qwen-Image VAE (bf16) for one side x side frame."""
    import torch
    from diffusers import AutoencoderKLQwenImage

    from trainer_core.devtools.memprobe import LiveBytes

    vae = AutoencoderKLQwenImage(base_dim=base_dim).to(torch.bfloat16).eval()
    image = (torch.rand(1, 3, 1, side, side) * 2 - 1).bfloat16()  # (B, 3, T, H, W)
    latents = torch.randn(1, vae.config.z_dim, 1, side // 8, side // 8).bfloat16()  # (B, C, T, h, w)
    with torch.no_grad(), LiveBytes() as live:
        vae.encode(image).latent_dist.mode()
    encode = live.peak
    with torch.no_grad(), LiveBytes() as live:
        vae.decode(latents).sample
    return encode, live.peak


def text_encoder_peak(hidden: int, layers: int, tokens: int) -> tuple[int, int]:
    """(peak bytes, intermediate size) of a narrow Qwen2.5-VL language model's forward (bf16, no grad)."""
    import torch

    from trainer_core.devtools.memprobe import LiveBytes
    from trainer_core.models.qwen_arch import QWEN25_VL_7B_CONFIG
    from trainer_core.models.text_encoder_file import empty_text_encoder

    config = copy.deepcopy(QWEN25_VL_7B_CONFIG)
    real = config["text_config"]
    intermediate = hidden * real["intermediate_size"] // real["hidden_size"]
    real.update(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers, max_window_layers=layers,
                num_attention_heads=hidden // 128, num_key_value_heads=1, vocab_size=4096, pad_token_id=0,
                bos_token_id=1, eos_token_id=2)
    model = empty_text_encoder(config)
    model.to_empty(device="cpu")
    model = model.to(torch.bfloat16)
    for p in model.parameters():
        torch.nn.init.normal_(p, 0.0, 0.02)
    ids = torch.randint(0, 4096, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), LiveBytes() as live:
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
        del out
    return live.peak, intermediate


def main() -> None:
    from trainer_core.runs.cli import _quiet_libraries
    from trainer_core.models.qwen_arch import LORA_TARGET_PRESETS

    _quiet_libraries()
    grid, text = 64, 256
    table = {}
    for preset in LORA_TARGET_PRESETS:
        for dtype in ("float32", "bfloat16"):
            ratios = []
            for heads in (2, 4):
                peak, f = block_forward_peak(heads, grid, text, preset, dtype)
                ratios.append(peak / (f * (grid * grid + text)))
            table[(preset, dtype)] = round(max(ratios), 3)
            print(f"block forward {preset:14s} {dtype:9s} per joint token per F: "
                  f"{', '.join(f'{r:.4f}' for r in ratios)} (2, 4 heads)", flush=True)
    print("\nPREVIEW_WORKING_PER_TOKEN = {")
    for key, value in table.items():
        print(f"    {key!r}: {value},")
    print("}\n")

    sides = (256, 512)
    real = [vae_peaks(96, s) for s in sides]
    pixels = [s * s for s in sides]
    for name, i in (("encode", 0), ("decode", 1)):
        slope = (real[1][i] - real[0][i]) / (pixels[1] - pixels[0])
        print(f"VAE {name}, base_dim 96: {real[0][i]:,d} B at 256 px, {real[1][i]:,d} B at 512 px: "
              f"slope {slope:.2f} B/px, intercept {real[0][i] - slope * pixels[0]:,.0f} B, per base channel "
              f"{slope / 96:.3f} B/px", flush=True)
    half = vae_peaks(48, 256)
    print(f"VAE base_dim 48 at 256 px: encode {half[0] / pixels[0] / 48:.3f}, decode {half[1] / pixels[0] / 48:.3f} "
          "B/px per base channel (proportional when these equal the ones above)\n", flush=True)

    tokens, layers = 300, 4
    rows = []
    for hidden in (512, 1024):
        peak, intermediate = text_encoder_peak(hidden, layers, tokens)
        rest = peak / tokens - 3 * layers * hidden - 3 * intermediate * 2
        rows.append(rest)
        print(f"text encoder hidden {hidden}, {layers} layers, {tokens} tokens: peak {peak:,d} B, remainder per token "
              f"{rest:.0f} B", flush=True)
    longer, _ = text_encoder_peak(512, 2 * layers, tokens)
    per_layer = (longer - text_encoder_peak(512, layers, tokens)[0]) / tokens / layers / 512
    print(f"text encoder: each further layer adds {per_layer:.3f} B per token per hidden unit (3 expected)")


if __name__ == "__main__":
    main()
