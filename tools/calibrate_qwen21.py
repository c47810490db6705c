"""Measure the working memory the planner uses for Qwen-Image 2.1 (`trainer_core/planner/single_stream.py`, and
its parts' constants in `planner/inference.py`) and print the constants.

    OMP_NUM_THREADS=1 .venv/bin/python tools/calibrate_qwen21.py [--heads 4] [--grid 64] [--text 256] [--skip-vae]

All peaks of live bytes above the inputs (`memprobe.LiveBytes`), bf16, on the CPU:
- a 2.1 block's training forward + backward (`memprobe.probe_block21`) minus what it saves (the exact formula,
  asserted equal to SavedTensors here), per joint row (prompt + target) per unit of MLP width F, for every
  (preset, LoRA dtype, dropout, checkpointing); the block's no-grad forward (eval, LoRA on) per joint row per F;
  at --heads x 128 wide (the ratio does not depend on the width: 2 and 4 heads are printed side by side);
- the real 2.1 VAE (diffusers' `AutoencoderKLQwenImage21` defaults, RGBA, 16x) encoding and decoding one frame
  at 256 and 512 px: the slope per pixel, per base channel;
- a narrow Qwen3-VL (the real vocabulary and layout, few layers) encoding one prompt as the 2.1 pipeline does
  (every hidden state kept, the logits computed): per token, what is left after 3 x layers x hidden, 3 x
  intermediate x 2 and the logits (vocabulary x 2).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def tiny_block_model(heads: int):
    import torch
    from diffusers import QwenImage21Transformer2DModel

    from trainer_core.models.float8 import store_block_linears

    model = QwenImage21Transformer2DModel(num_layers=2, num_attention_heads=heads, context_in_dim=64,
                                          in_channels=8, out_channels=8).to(torch.bfloat16)
    model.requires_grad_(False)
    store_block_linears(model, "bfloat16")
    return model


def training_table(heads: int, grid: int, text: int, rank: int = 4) -> dict:
    import torch

    from trainer_core.adapters.lora import inject_lora, remove_lora
    from trainer_core.core.config import LoraConfig
    from trainer_core.devtools.memprobe import probe_block21
    from trainer_core.planner.activations import ActivationSettings, block_saved_bytes
    from trainer_core.planner.arch import arch_from_transformer

    model = tiny_block_model(heads)
    arch = arch_from_transformer(model)
    rows = grid * grid + text
    table = {}
    for preset, dtype, dropout, ckpt in itertools.product(
            ("attention", "attention+mlp"), ("float32", "bfloat16"), (False, True), (True, False)):
        params = inject_lora(model, LoraConfig(rank=rank, alpha=rank, targets=preset, dtype=dtype,
                                               dropout=0.1 if dropout else 0.0), seed=0)
        model.train()
        with torch.no_grad():
            for p in params:
                p.normal_(0, 0.01)
        probe = probe_block21(model, 1, (grid, grid), text, checkpointing=ckpt)
        settings = ActivationSettings(preset=preset, rank=rank, lora_bytes=4 if dtype == "float32" else 2,
                                      dropout=dropout, cuda=False, checkpointing=ckpt)
        saved = block_saved_bytes(arch, settings, 1, grid * grid, text)
        assert saved == probe.saved_bytes, (preset, dtype, dropout, saved, probe.saved_bytes)
        table[(preset, dtype, dropout, ckpt)] = (probe.peak_bytes - saved) / (arch.mlp_dim * rows)
        remove_lora(model)
    return table


def preview_table(heads: int, grid: int, text: int) -> dict:
    import torch

    from trainer_core.adapters.lora import inject_lora, remove_lora
    from trainer_core.core.config import LoraConfig
    from trainer_core.devtools.memprobe import LiveBytes, block21_inputs

    model = tiny_block_model(heads)
    f = model.transformer_blocks[0].img_mlp.proj.out_features
    table = {}
    for preset, dtype in itertools.product(("attention", "attention+mlp"), ("float32", "bfloat16")):
        inject_lora(model, LoraConfig(rank=4, alpha=4.0, targets=preset, dtype=dtype), seed=0)
        model.eval()
        hidden, rest = block21_inputs(model, 1, (grid, grid), text)
        hidden = hidden.detach()
        with torch.no_grad(), LiveBytes() as live:
            out = model.transformer_blocks[0](hidden, *rest)
            del out
        table[(preset, dtype)] = live.peak / (f * (grid * grid + text))
        remove_lora(model)
    return table


def vae_slopes() -> tuple[float, float, int]:
    """(encode, decode) bytes per pixel per base channel of the real 2.1 VAE in bf16, and its base_dim."""
    import torch
    from diffusers import AutoencoderKLQwenImage21

    from trainer_core.devtools.memprobe import LiveBytes

    vae = AutoencoderKLQwenImage21().to(torch.bfloat16).eval()
    peaks = []
    for side in (256, 512):
        image = (torch.rand(1, 4, 1, side, side) * 2 - 1).bfloat16()  # (B, RGBA, T, H, W)
        latents = torch.randn(1, vae.config.z_dim, 1, side // 16, side // 16).bfloat16()
        with torch.no_grad(), LiveBytes() as live:
            vae.encode(image).latent_dist.mode()
        encode = live.peak
        with torch.no_grad(), LiveBytes() as live:
            vae.decode(latents).sample
        peaks.append((encode, live.peak))
        print(f"VAE at {side} px: encode {encode:,d} B, decode {live.peak:,d} B", flush=True)
    pixels = 512 * 512 - 256 * 256
    base = vae.config.base_dim
    return ((peaks[1][0] - peaks[0][0]) / pixels / base, (peaks[1][1] - peaks[0][1]) / pixels / base, base)


def text_encoder_remainder(hidden: int = 512, layers: int = 4, tokens: int = 300) -> float:
    import copy

    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from trainer_core.devtools.memprobe import LiveBytes
    from trainer_core.families.qwen_image21.arch import QWEN3_VL_8B_CONFIG

    config = copy.deepcopy(QWEN3_VL_8B_CONFIG)
    text = config["text_config"]
    intermediate = hidden * text["intermediate_size"] // text["hidden_size"]
    text.update(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=hidden // 128, num_key_value_heads=1)
    config["vision_config"].update(depth=1, out_hidden_size=hidden, deepstack_visual_indexes=[])
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**config)).to(torch.bfloat16).eval()
    ids = torch.randint(0, text["vocab_size"], (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), LiveBytes() as live:
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
        del out
    return live.peak / tokens - 3 * layers * hidden - 3 * intermediate * 2 - text["vocab_size"] * 2


def main() -> None:
    from trainer_core.runs.cli import _quiet_libraries

    parser = argparse.ArgumentParser()
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--grid", type=int, default=64, help="target tokens per side")
    parser.add_argument("--text", type=int, default=256)
    parser.add_argument("--skip-vae", action="store_true")
    args = parser.parse_args()
    _quiet_libraries()
    tables = [training_table(h, args.grid, args.text) for h in (2, args.heads)]
    print("WORKING_PER_ROW = {  # 2 and", args.heads, "heads:", {k: round(tables[0][k], 3) for k in tables[0]})
    for key in tables[1]:
        print(f"    {key!r}: {round(max(t[key] for t in tables), 3)},")
    print("}", flush=True)
    previews = [preview_table(h, args.grid, args.text) for h in (2, args.heads)]
    print("PREVIEW_WORKING_PER_ROW = {  # 2 heads:", {k: round(v, 3) for k, v in previews[0].items()})
    for key in previews[1]:
        print(f"    {key!r}: {round(max(t[key] for t in previews), 3)},")
    print("}", flush=True)
    print(f"text encoder remainder per token: {text_encoder_remainder():.0f} B", flush=True)
    if not args.skip_vae:
        encode, decode, base = vae_slopes()
        print(f"VAE per pixel per base channel (base_dim {base}): encode {encode:.2f}, decode {decode:.2f}")


if __name__ == "__main__":
    main()
