"""Command line: `python -m trainer_core demo|...`."""

from __future__ import annotations

import argparse
import logging
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
    from .demo import run_demo

    result = run_demo(args.out, steps=args.steps, seed=args.seed, resume=args.resume)
    print(f"loss: first step {result.first_loss:.4f}, last step {result.last_loss:.4f} ({result.steps} steps)")
    print(f"lora:      {result.lora}")
    print(f"preview:   {result.preview}")
    print(f"loss plot: {result.loss_plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainer_core", description="Qwen-Image LoRA trainer engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a small LoRA on the built-in tiny model and a generated dataset")
    demo.add_argument("--steps", type=int, default=200, help="total optimizer steps (default 200)")
    demo.add_argument("--out", default="demo_out", help="output folder (default demo_out)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--resume", action="store_true",
                      help="continue from the checkpoint in --out up to --steps total steps")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_libraries()
    return args.func(args)
