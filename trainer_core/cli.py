"""Command line: `python -m trainer_core demo|plan`."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings


def _quiet_libraries() -> None:
    """Keep the terminal to our own progress lines: libraries' info logs and progress bars are noise here."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)


def cmd_demo(args: argparse.Namespace) -> int:
    import torch

    from .demo import run_demo
    from .errors import UserInputError

    files = (args.transformer, args.text_encoder, args.vae)
    components = None
    if any(files):
        if not all(files):
            raise UserInputError("demo from files needs all three of --transformer, --text-encoder and --vae.")
        from .models import load_single_files

        # As the built-in demo: float8 block weights, fp32 compute (the CPU has no fast bf16 matmul).
        components = load_single_files(*files, tokenizer_dir=args.tokenizer, storage="float8",
                                       compute_dtype=torch.float32, text_encoder_fp8=args.text_encoder_fp8)
        print(f"model: {components.name} from {', '.join(files)}")
    result = run_demo(args.out, steps=args.steps, seed=args.seed, components=components,
                      resume=args.resume, blocks_to_swap=args.blocks_to_swap)
    print(f"loss: first step {result.first_loss:.4f}, last step {result.last_loss:.4f} ({result.steps} steps)")
    print(f"lora:      {result.lora}")
    print(f"preview:   {result.preview}")
    print(f"loss plot: {result.loss_plot}")
    return 0


def cmd_export_tiny(args: argparse.Namespace) -> int:
    from .devtools.export import export_tiny

    for name, path in export_tiny(args.dir, layout=args.layout, seed=args.seed).items():
        print(f"{name}: {path}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from .planner import GIB, PlanInputs, auto_blocks_to_swap, plan_memory, render_choice, render_plan

    width = args.width or args.resolution
    height = args.height or args.resolution
    inputs = PlanInputs(
        width=width, height=height, batch=args.batch, text_tokens=args.text_tokens, rank=args.rank,
        targets=args.targets, lora_dtype=args.lora_dtype, storage=args.storage,
        checkpointing=not args.no_checkpointing, blocks_to_swap=args.blocks_to_swap or 0,
        optimizer=args.optimizer, grad_accum_steps=args.grad_accum, dataset_images=args.images,
        text_encoder_storage=args.text_encoder_storage,
    )
    if args.blocks_to_swap is not None:
        budget = int(args.budget_gb * GIB) if args.budget_gb is not None else None
        print(render_plan(plan_memory(inputs), budget))
        return 0
    choice = auto_blocks_to_swap(inputs, int(args.budget_gb * GIB))
    print(render_choice(choice))
    return 0 if choice.fits else 1


def _swap_count(text: str) -> int:
    """argparse type for --blocks-to-swap: a number or 'auto', with the engine's own message when wrong."""
    from .config import parse_blocks_to_swap
    from .errors import UserInputError

    try:
        return parse_blocks_to_swap(text)
    except UserInputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    from .models.qwen_arch import LORA_TARGET_PRESETS

    parser = argparse.ArgumentParser(prog="python -m trainer_core", description="Qwen-Image LoRA trainer engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a small LoRA on the built-in tiny model and a generated dataset")
    demo.add_argument("--steps", type=int, default=200, help="total optimizer steps (default 200)")
    demo.add_argument("--out", default="demo_out", help="output folder (default demo_out)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--blocks-to-swap", type=_swap_count, default=1, metavar="N|auto",
                      help="blocks whose frozen weights stay in CPU RAM (default 1, to exercise swapping); 'auto' "
                           "picks the fewest that fit the GPU from the memory plan (none on a CPU)")
    demo.add_argument("--resume", action="store_true",
                      help="continue from the checkpoint in --out up to --steps total steps")
    demo.add_argument("--transformer", help="train this transformer file (e.g. from export-tiny) instead of the "
                                            "built-in model; needs --text-encoder and --vae too")
    demo.add_argument("--text-encoder", help="text encoder file (ComfyUI layout, bf16 or fp8_scaled)")
    demo.add_argument("--vae", help="VAE file (ComfyUI's Wan 2.1 layout)")
    demo.add_argument("--tokenizer", help="tokenizer folder (default: a tokenizer/ folder beside the text encoder "
                                          "file or its folder)")
    demo.add_argument("--text-encoder-fp8", choices=("dequantize", "keep"), default="dequantize",
                      help="a scaled-fp8 text encoder: dequantise while loading, or keep float8 weights")
    demo.set_defaults(func=cmd_demo)
    export = sub.add_parser("export-tiny", help="write the tiny test model as ComfyUI single files (every format, "
                                                "with config JSONs and the tokenizer) or as a diffusers folder")
    export.add_argument("dir", help="output folder")
    export.add_argument("--layout", choices=("comfyui", "diffusers"), default="comfyui")
    export.add_argument("--seed", type=int, default=0)
    export.set_defaults(func=cmd_export_tiny)

    plan = sub.add_parser(
        "plan", help="predict GPU memory and host RAM of a training setup (real Qwen-Image), term by term",
        description="Without --blocks-to-swap, picks the fewest swapped blocks that fit --budget-gb "
                    "(GiB, default 24); exits 1 when nothing fits, with what to change.")
    plan.add_argument("--resolution", type=int, default=1024, help="square side in pixels (default 1024)")
    plan.add_argument("--width", type=int, help="image width in pixels (overrides --resolution)")
    plan.add_argument("--height", type=int, help="image height in pixels (overrides --resolution)")
    plan.add_argument("--rank", type=int, default=32)
    how = plan.add_mutually_exclusive_group()
    how.add_argument("--blocks-to-swap", type=int, help="plan this swap count")
    how.add_argument("--budget-gb", type=float, default=None, help="GPU budget in GiB for the automatic choice")
    plan.add_argument("--batch", type=int, default=1, help="micro-batch size")
    plan.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps")
    plan.add_argument("--targets", choices=list(LORA_TARGET_PRESETS), default="attention+mlp")
    plan.add_argument("--lora-dtype", choices=["float32", "bfloat16"], default="float32")
    plan.add_argument("--storage", choices=["float8", "float8_scaled", "bfloat16"], default="float8")
    plan.add_argument("--no-checkpointing", action="store_true", help="plan without gradient checkpointing")
    plan.add_argument("--optimizer", choices=["adamw8bit", "adamw"], default="adamw8bit")
    plan.add_argument("--text-tokens", type=int, default=256, help="prompt tokens per sample (default 256)")
    plan.add_argument("--images", type=int, default=0, help="dataset images whose cache stays in host RAM")
    plan.add_argument("--text-encoder-storage", choices=["bfloat16", "float8"], default="bfloat16")
    plan.set_defaults(func=cmd_plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .errors import UserInputError

    args = build_parser().parse_args(argv)
    if getattr(args, "command", None) == "plan" and args.blocks_to_swap is None and args.budget_gb is None:
        args.budget_gb = 24.0
    _quiet_libraries()
    try:
        return args.func(args)
    except UserInputError as e:  # the message says what is wrong and what to do: no traceback needed
        print(f"error: {e}", file=sys.stderr)
        return 2
