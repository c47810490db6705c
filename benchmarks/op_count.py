"""Operators dispatched per Qwen-Image block forward + backward at the real width, diffusers' own block against
ours (`trainer_core.models.fused_block`), on the CPU in seconds (issue 51: the count must fall by at least half).

    .venv/bin/python benchmarks/op_count.py                 # 3072 wide, 64 image + 16 text tokens, fp32
    .venv/bin/python benchmarks/op_count.py --no-compiled   # without the compiled column (it compiles ~1 min)
    .venv/bin/python benchmarks/op_count.py --tiny          # a 64-wide block: the smoke run

What is counted (torch.profiler, one forward + backward after a warm-up): every operator the dispatcher receives
from Python or autograd (aten ops not nested in another aten op) and every kernel Inductor generated (its C++
kernels, `cpp.enable_kernel_profile`). `kernels` leaves out the ones that launch no kernel on a GPU (views,
allocations, metadata): the nearer proxy for the ~170 kernels per block forward seen on the H100. Columns: the
block without a LoRA (the fused chain alone), and with peft's rank-32 LoRA on its attention and MLP Linears
(peft's forward), and the same LoRA through `adapters.fused_lora` (what the trainer runs: its LoRA added in place).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from trainer_core.adapters import fused_lora  # noqa: E402
from trainer_core.models import fused_block  # noqa: E402
from trainer_core.models.attention_backend import AttentionChoice  # noqa: E402

# Operators that launch no kernel on a GPU: views, allocations, metadata.
NO_KERNEL = {
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::_unsafe_view", "aten::as_strided",
    "aten::expand", "aten::unsqueeze", "aten::squeeze", "aten::permute", "aten::transpose", "aten::t",
    "aten::reshape", "aten::slice", "aten::select", "aten::split", "aten::chunk", "aten::unflatten", "aten::flatten",
    "aten::alias", "aten::detach", "aten::view_as_real", "aten::view_as_complex", "aten::unbind", "aten::narrow",
    "aten::result_type", "aten::lift_fresh", "aten::split_with_sizes", "aten::_reshape_alias", "aten::numpy_T",
}
LORA_TARGETS = ["to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out",
                "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2"]
REAL = dict(width=3072, heads=24, axes=[16, 56, 56])
TINY = dict(width=64, heads=2, axes=[16, 8, 8])


def block_and_inputs(width: int, heads: int, axes: list[int], grid=(1, 8, 8), text: int = 16, lora_rank: int = 0,
                     dtype=torch.float32, device="cpu", seed: int = 0):
    """A diffusers Qwen-Image block with random weights (filled, not diffusers' slow init) and peft's LoRA of
    `lora_rank` (0: none) on its attention and MLP Linears, and its keyword inputs: image (1, prod(grid), D)
    needing a gradient, text (1, text, D), temb (1, D), the RoPE frequencies."""
    from diffusers.models.transformers.transformer_qwenimage import QwenEmbedRope, QwenImageTransformerBlock

    torch.manual_seed(seed)
    with torch.device("meta"):
        block = QwenImageTransformerBlock(width, heads, width // heads)
    block.to_empty(device=device)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(std=width ** -0.5 if p.dim() > 1 else 0.02)
        for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            getattr(block.attn, name).weight.fill_(1.0)
    block.requires_grad_(False)
    if lora_rank:
        from peft import LoraConfig, inject_adapter_in_model

        inject_adapter_in_model(LoraConfig(r=lora_rank, lora_alpha=lora_rank, target_modules=LORA_TARGETS), block)
        for name, p in block.named_parameters():
            if "lora_" in name:
                p.requires_grad_(True)
    block.to(dtype)
    rope = QwenEmbedRope(theta=10000, axes_dim=axes, scale_rope=True)
    g = torch.Generator().manual_seed(seed + 1)
    kwargs = dict(
        hidden_states=torch.randn(1, grid[0] * grid[1] * grid[2], width, generator=g).to(device, dtype),
        encoder_hidden_states=torch.randn(1, text, width, generator=g).to(device, dtype),
        encoder_hidden_states_mask=None, temb=torch.randn(1, width, generator=g).to(device, dtype),
        image_rotary_emb=rope([[grid]], max_txt_seq_len=text, device=torch.device(device)))
    kwargs["hidden_states"].requires_grad_(True)
    return block, kwargs


def forward_backward(block, kwargs) -> None:
    text, image = block(**kwargs)
    (text.float().sum() + image.float().sum()).backward()


def count(block, kwargs) -> tuple[int, int, collections.Counter]:
    """(operators, kernel-launching operators, their names) of one forward + backward (after one warm-up)."""
    import torch._inductor.config as inductor_config
    from torch.profiler import ProfilerActivity, profile

    inductor_config.cpp.enable_kernel_profile = True
    forward_backward(block, kwargs)  # warm-up: compiling, the RoPE tables' first use
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward_backward(block, kwargs)
    names: collections.Counter = collections.Counter()
    for event in prof.events():
        if not _counted(event.name):
            continue
        parent = event.cpu_parent
        while parent is not None and not _counted(parent.name):
            parent = parent.cpu_parent
        if parent is None:  # not nested in another operator: dispatched from Python or autograd
            names[event.name] += 1
    kernels = sum(n for name, n in names.items() if name not in NO_KERNEL)
    return sum(names.values()), kernels, names


def _counted(name: str) -> bool:
    return name.startswith("aten::") or "cpp_fused" in name or "triton_" in name


def measure(size: dict, lora_rank: int, modes: list[str], fused_lora_adds: bool = False) -> dict[str, tuple[int, int]]:
    """`fused_lora_adds`: the LoRA through `adapters.fused_lora` (as the trainer's runner installs it) instead of
    peft's own forward."""
    block, kwargs = block_and_inputs(**size, lora_rank=lora_rank)
    if fused_lora_adds:
        assert fused_lora.install([block])
    results = {"diffusers": count(block, kwargs)[:2]}
    for mode in modes:
        installed = fused_block.install([block], mode, AttentionChoice("sdpa", "PyTorch's pick"),
                                        torch.device("cpu"), allow_cpu_compile=True)
        assert installed.mode == mode, (installed.mode, mode)
        try:
            results[f"fused {mode}"] = count(block, kwargs)[:2]
        finally:
            installed.uninstall()
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a 64-wide block (the smoke run)")
    parser.add_argument("--no-compiled", action="store_true", help="leave out the compiled column")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    size = TINY if args.tiny else REAL
    modes = [fused_block.EAGER] + ([] if args.no_compiled else [fused_block.COMPILED])
    table = {"no LoRA": measure(size, 0, modes), "LoRA rank 32": measure(size, 32, modes),
             "fused LoRA rank 32": measure(size, 32, modes, fused_lora_adds=True)}
    print(f"operators per block forward + backward, width {size['width']}, 64 image + 16 text tokens, fp32, CPU")
    print("| path | " + " | ".join(f"{c}: ops | {c}: kernels" for c in table) + " |")
    print("| --- |" + " --- | --- |" * len(table))
    for path in table["no LoRA"]:
        cells = []
        for column in table.values():
            ops, kernels = column[path]
            base_ops, base_kernels = column["diffusers"]
            cells += [f"{ops} ({ops / base_ops:.2f})", f"{kernels} ({kernels / base_kernels:.2f})"]
        print(f"| {path} | " + " | ".join(cells) + " |")
    return table


if __name__ == "__main__":
    main()
