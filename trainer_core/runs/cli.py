"""Command line: `python -m trainer_core demo|train|export-tiny|plan|caption`.

Flags that are settings take their help, default, choices and range from the config metadata
(`config_arg`); a bad value of any flag ends in one line, `error: ...` naming the flag, and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

from .cli_args import (
    _positive_int,
    blocks_to_swap_arg,
    check_writable_folder,
    config_arg,
    existing_path,
)
from .cli_caption import add_caption_parser
from .cli_demo import SHAPES_MODEL, add_demo_parser, cmd_demo, demo_models  # noqa: F401 (re-exported)


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


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..core.errors import MissingPath, TrainingStopped, UserInputError
    from ..training import distributed
    from .agreement import check_same_settings
    from .headless import train_run
    from .startup import load_engine
    from .run_file import parse_run_tables, read_run_file
    from .run_file_help import help_config

    if args.help_config:
        print(help_config(), end="")
        return 0
    if args.from_diffusion_pipe:
        from .diffusion_pipe import translate

        translation = translate(args.from_diffusion_pipe)
        text = translation.text
        where = f"the translation of {args.from_diffusion_pipe}"
        if args.print_only:  # prepared for another machine, its paths need not exist here: print, then warn
            print(text, end="", flush=True)
            try:
                parse_run_tables(translation.data, Path.cwd(), where=where)
            except MissingPath as e:  # prepared for another machine: fine there
                print(f"warning: {e} The translation above is printed anyway (--print-only); it trains where that "
                      "path exists.", file=sys.stderr)
            except UserInputError as e:  # a refused value trains nowhere
                print(f"warning: {e} The translation above is printed anyway (--print-only), but it trains nowhere "
                      "as it is: correct that setting in it first.", file=sys.stderr)
            return 0
        run = parse_run_tables(translation.data, Path.cwd(), where=where)
    elif args.config:
        run, text = read_run_file(args.config)
    else:
        raise UserInputError("train needs --config RUN.toml (or --from-diffusion-pipe CONFIG.toml); "
                             "--help-config lists every setting of a run file.")
    if args.output:
        run.headless.output_folder = str(Path(args.output).expanduser().resolve())
    replicas = distributed.join()
    try:
        if args.from_diffusion_pipe and replicas.writes:
            print(text, end="", flush=True)
        if args.print_only:
            return 0
        # Processes whose run files disagree stop here, before the engine's imports (seconds each); train_run asks
        # again for a script that calls it (one small exchange).
        check_same_settings(run, replicas, args.steps)
        load_engine()
        check_writable_folder(str(run.output_folder), "[output] folder")
        return train_run(run, replicas, text, steps=args.steps)
    except TrainingStopped as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        replicas.leave()


def cmd_export_tiny(args: argparse.Namespace) -> int:
    from safetensors import SafetensorError

    from ..core.files import os_error, write_error
    from ..families import get_family

    check_writable_folder(args.dir, "dir")
    try:  # the family's own files (its hook), named as ComfyUI names that model's
        written = get_family(args.model).export_tiny(args.dir, layout=args.layout, seed=args.seed, name=args.model)
    except (OSError, SafetensorError) as e:
        if os_error(e) is None:
            raise
        raise write_error(e, "tiny model files", args.dir, "") from None
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    import dataclasses

    from ..core.config import AUTO_SWAP, PlanConfig, field_default, parse_checkpointing
    from ..core.errors import UserInputError
    from ..families import get_family
    from ..planner import GIB, PlanInputs, auto_blocks_to_swap, plan_memory, render_choice, render_plan
    from ..planner.phases import plan_phases
    from ..planner.render import render_phase_terms, render_phases

    family = get_family(args.model)  # its real model: transformer, text encoder as ComfyUI's file loads it, VAE
    arch, parts = family.planned_arch(), family.planned_parts(text_encoder_file=True)
    label, num_blocks = family.display_name, arch.num_blocks
    auto = args.blocks_to_swap == AUTO_SWAP
    if not auto and args.blocks_to_swap > num_blocks - 1:
        raise UserInputError(
            f"--blocks-to-swap {args.blocks_to_swap}: {label} has {num_blocks} transformer blocks and at least one "
            f"must stay on the GPU: use 0 to {num_blocks - 1}, or 'auto' (or leave it out) to let the planner choose."
        )
    # The text encoder file ComfyUI's templates download: Qwen-Image's fp8 scaled, 2.1's int8 ConvRot (one byte either).
    te_file = args.text_encoder_file if args.text_encoder_file != "auto" else parts.one_byte_text_encoder_format
    te_fp8_file = te_file != "bf16"
    if not te_fp8_file and args.text_encoder_storage == "float8":
        raise UserInputError("--text-encoder-storage float8 keeps a one-byte file's Linears, and --text-encoder-file "
                             "bf16 has none: use --text-encoder-file fp8 or int8, or --text-encoder-storage bfloat16.")
    if arch.single_stream and args.gpu is not None:
        raise UserInputError(f"--gpu: the step-time model (planner/timeline.py) is Qwen-Image's dual-stream one; "
                             f"it does not model {label}'s single-stream blocks yet. Leave --gpu out.")
    width = args.width if args.width is not None else args.resolution
    height = args.height if args.height is not None else args.resolution
    ram = int(args.ram_gb * GIB) if args.ram_gb else None
    checkpointing = "off" if args.no_checkpointing else parse_checkpointing(args.checkpointing)
    inputs = PlanInputs(
        width=width, height=height, batch=args.batch, text_tokens=args.text_tokens, rank=args.rank,
        targets=args.targets, lora_dtype=args.lora_dtype, adapter=args.adapter, lokr_factor=args.lokr_factor,
        lokr_decompose_both=args.lokr_decompose_both, storage=args.storage,
        checkpointing=checkpointing != "off", blocks_to_swap=0 if auto else args.blocks_to_swap,
        optimizer=args.optimizer, grad_accum_steps=args.grad_accum, dataset_images=args.images,
        text_encoder_storage=args.text_encoder_storage, preview_width=args.preview_size,
        preview_height=args.preview_size, text_encoder_file_fp8=te_fp8_file,
        text_encoder_streamed=None,  # the fewest layers that fit the budget (choose_encoder_streaming)
        caption=args.caption, caption_tokens=args.caption_tokens,
    )
    inputs = _with_references(args, inputs, arch)
    if not auto:
        budget = int(args.budget_gb * GIB) if args.budget_gb is not None else None
        if checkpointing == "auto" and budget is not None:
            inputs = _checkpointing_for(inputs, budget, arch, parts)
        print(render_plan(plan_memory(inputs, arch), budget))
    else:
        budget_gb = args.budget_gb if args.budget_gb is not None else field_default(PlanConfig, "budget_gb")
        budget = int(budget_gb * GIB)
        choice = auto_blocks_to_swap(inputs, budget, arch, parts)
        # When nothing fits, the phase table below lists the changes that would (GPU and host RAM together).
        print(render_choice(choice) if choice.fits else render_plan(choice.plan, budget))
        inputs = dataclasses.replace(inputs, blocks_to_swap=choice.plan.inputs.blocks_to_swap)
        if checkpointing == "auto" and choice.fits:
            inputs = _checkpointing_for(inputs, budget, arch, parts)
    if not auto or choice.fits:
        _print_timeline(args, inputs)
    caption_parts = family.planned_caption_parts() if args.caption else None
    phases = plan_phases(inputs, arch, ram_bytes=ram, gpu_budget_bytes=budget, parts=parts, caption_parts=caption_parts)
    print()
    print(render_phases(phases))
    if args.caption:
        print()
        print(render_phase_terms(phases, "caption"))
    if args.gpus == 1:
        return 0 if phases.fits else 1
    from ..planner.machine import plan_machine, render_machine

    machine = plan_machine(phases, args.gpus)
    print()
    print(render_machine(machine))
    return 0 if phases.fits and machine.fits() else 1


def _checkpointing_for(inputs, budget: int, arch, parts):
    """`inputs` recomputing only as many blocks as `budget` needs (gradient_checkpointing 'auto', as a run on a GPU
    with that much free memory chooses: planner.for_run.check_run), said in one line."""
    import dataclasses

    from ..planner.for_run import checkpointing_note
    from ..planner.search import auto_checkpointed_blocks

    checkpointed = auto_checkpointed_blocks(inputs, budget, arch, parts)
    print()
    print(checkpointing_note(checkpointed, arch.num_blocks, budget, swapped=bool(inputs.blocks_to_swap)))
    return dataclasses.replace(inputs, checkpointed_blocks=checkpointed if checkpointed < arch.num_blocks else None)


def _with_references(args: argparse.Namespace, inputs, arch):
    """`inputs` with --references square reference images at --control-resolution (Qwen-Image 2.1 editing)."""
    from ..core.errors import UserInputError
    from ..planner.references import reference_size, with_references

    if not args.references:
        return inputs
    if not arch.single_stream:
        raise UserInputError("--references: the plan counts reference images for --model qwen-image-2.1 only "
                             "(Qwen-Image-Edit's control images and its vision tower: a run's own plan counts them, this command not yet).")
    w, h = reference_size(args.control_resolution)
    if w * h < 256 * 256:
        raise UserInputError(f"--control-resolution {args.control_resolution}: a reference would be {w}x{h} px, under "
                             "the 256x256 px Qwen3-VL's processor enlarges smaller images to; use 0 or 256 and more.")
    return with_references(inputs, args.references, args.control_resolution)


def _print_timeline(args: argparse.Namespace, inputs) -> None:
    if args.gpu is None:
        return
    from ..planner.timeline import GPUS, render_timeline

    print()
    print(render_timeline(inputs, GPUS[args.gpu]))


# --------------------------------------------------------------------------------------------------
# flags from the config metadata

class _Parser(argparse.ArgumentParser):
    """argparse that raises a UserInputError instead of printing usage and exiting: main() prints one line,
    `error: ...`, naming the flag, and returns 2."""

    def error(self, message: str):
        from ..core.errors import UserInputError

        raise UserInputError(f"{message} (see: {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    from ..core.config import (
        DatasetConfig,
        HeadlessConfig,
        LoraConfig,
        OptimizerConfig,
        PlanConfig,
        TrainConfig,
        help_text,
    )

    parser = _Parser(prog="python -m trainer_core", description="Qwen-Image LoRA trainer engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_demo_parser(sub)
    train = sub.add_parser(
        "train", help="train from a run file (TOML), without a canvas; under torchrun on several GPUs",
        description="Trains the run a TOML run file describes (--help-config prints every setting with its help and "
                    "default). Running the same command again resumes the run up to its length; Ctrl-C stops at "
                    "the next step with a checkpoint. Several GPUs: torchrun --nproc-per-node N -m trainer_core "
                    "train --config RUN.toml (data-parallel; process 0 writes every file).")
    what = train.add_mutually_exclusive_group()
    what.add_argument("--config", type=existing_path("file"), help="the run file (TOML)")
    what.add_argument("--from-diffusion-pipe", type=existing_path("file"), metavar="CONFIG.toml",
                      help="a diffusion-pipe Qwen-Image config (and the dataset file it names): print its translation "
                           "into a run file, each field mapped or listed as ignored with the reason, then train it")
    what.add_argument("--help-config", action="store_true",
                      help="print every setting of a run file with its help and default (a commented template)")
    train.add_argument("--print-only", action="store_true",
                       help="with --from-diffusion-pipe: print the translation and stop (save it as a run file)")
    train.add_argument("--steps", **config_arg(
        HeadlessConfig, "steps", default=None, shown_default="the run file's [train] steps and epochs",
        help="train up to this many steps in all, instead of the run file's length"))
    train.add_argument("--output", metavar="DIR", help="the output folder instead of the run file's [output] folder")
    train.set_defaults(func=cmd_train)
    export = sub.add_parser("export-tiny", help="write the tiny test model as ComfyUI single files (every format, "
                                                "with config JSONs and the tokenizer) or as a diffusers folder")
    export.add_argument("dir", help="output folder")
    from ..core.choices import EXPORT_LAYOUTS
    from ..families import DEFAULT, family_names

    export.add_argument("--layout", choices=EXPORT_LAYOUTS, default=EXPORT_LAYOUTS[0],
                        help=f"ComfyUI single files or a diffusers folder (default: {EXPORT_LAYOUTS[0]})")
    export.add_argument("--seed", **config_arg(TrainConfig, "seed", default=0, help="seed of the random weights"))
    export.add_argument("--model", choices=family_names(aliases=True), default=DEFAULT,
                        help="a model family's tiny model: qwen-image (qwen-image-2512: the same files named as "
                             "ComfyUI's Qwen-Image-2512 release), a Qwen-Image-Edit variant (Edit-2511's transformer "
                             "files carry ComfyUI's marker key), qwen-image-2.1 (transformer files with the MLP fused "
                             "and split, the other parts as a diffusers folder), or qwen-image-layered (its RGBA VAE, "
                             "and the transformer's addition_t_embedding by which ComfyUI knows Layered)")
    export.set_defaults(func=cmd_export_tiny)

    plan = sub.add_parser(
        "plan", help="predict GPU memory and host RAM of a training setup (real Qwen-Image or 2.1), term by term",
        description="Without --blocks-to-swap (or with 'auto'), picks the fewest swapped blocks that fit "
                    "--budget-gb; with a number, plans that swap count (and compares it with --budget-gb when given). "
                    "Then prints each phase's GPU and host RAM peak (load, cache, init, train, preview, save), "
                    "checked against --budget-gb and --ram-gb; exits 1 when a phase does not fit, with the changes "
                    "that would. Defaults are the nodes' defaults.")
    plan.add_argument("--model", choices=family_names(aliases=True), default=DEFAULT,
                      help="the real model to plan for, by its family: qwen-image (Edit, 2512 and Layered plan as it: "
                           "the same transformer) or qwen-image-2.1 (32 single-stream blocks of width 4096, its "
                           "Qwen3-VL-8B text encoder and 16x VAE)")
    plan.add_argument("--resolution", **config_arg(DatasetConfig, "resolution", help="square side in pixels"))
    plan.add_argument("--width", **config_arg(PlanConfig, "width", default=None,
                                              help="image width in pixels, a multiple of 32 (default: --resolution)"))
    plan.add_argument("--height", **config_arg(PlanConfig, "height", default=None,
                                               help="image height in pixels, a multiple of 32 (default: --resolution)"))
    plan.add_argument("--rank", **config_arg(LoraConfig, "rank"))
    plan.add_argument("--blocks-to-swap", **blocks_to_swap_arg(shown_default="auto"))
    # No default in argparse: a budget given with a swap count is compared with that plan.
    plan.add_argument("--budget-gb", **config_arg(PlanConfig, "budget_gb", default=None,
                                                  shown_default=PlanConfig.budget_gb))
    plan.add_argument("--batch", **config_arg(TrainConfig, "micro_batch_size"))
    plan.add_argument("--grad-accum", **config_arg(TrainConfig, "grad_accum_steps"))
    plan.add_argument("--targets", **config_arg(LoraConfig, "targets"))
    plan.add_argument("--lora-dtype", **config_arg(LoraConfig, "dtype"))
    plan.add_argument("--adapter", **config_arg(LoraConfig, "adapter"))
    plan.add_argument("--lokr-factor", **config_arg(LoraConfig, "lokr_factor"))
    plan.add_argument("--lokr-decompose-both", action="store_true",
                      help=help_text(LoraConfig, "lokr_decompose_both").replace("%", "%%"))
    plan.add_argument("--storage", **config_arg(PlanConfig, "storage"))
    plan.add_argument("--checkpointing", **config_arg(TrainConfig, "gradient_checkpointing"))
    plan.add_argument("--no-checkpointing", action="store_true", help="the same as --checkpointing off")
    plan.add_argument("--optimizer", **config_arg(OptimizerConfig, "optimizer"))
    plan.add_argument("--text-tokens", **config_arg(PlanConfig, "text_tokens"))
    plan.add_argument("--images", **config_arg(PlanConfig, "dataset_images"))
    plan.add_argument("--text-encoder-storage", **config_arg(PlanConfig, "text_encoder_storage"))
    plan.add_argument("--text-encoder-file", **config_arg(PlanConfig, "text_encoder_file"))
    from ..planner.timeline import GPUS

    plan.add_argument("--gpu", choices=list(GPUS), default=None,
                      help="also predict seconds per step on this GPU and what streaming the swapped blocks costs "
                           "(timeline model: " + ", ".join(f"{g.name} = {g.label}" for g in GPUS.values()) + ")")
    plan.add_argument("--ram-gb", **config_arg(PlanConfig, "ram_gb"))
    plan.add_argument("--gpus", type=_positive_int, default=1,
                      help="GPUs of the machine, one training process each (torchrun --nproc-per-node): also print "
                           "the machine's host RAM, with one shared host copy of the frozen weights, and per GPU")
    plan.add_argument("--preview-size", **config_arg(PlanConfig, "preview_size"))
    plan.add_argument("--references", **config_arg(PlanConfig, "references"))
    plan.add_argument("--caption", action="store_true",
                      help="also plan captioning: the text encoder file's whole vision-language model (Qwen2.5-VL-7B; "
                           "Qwen3-VL-8B for qwen-image-2.1) writing one image's caption, before caching")
    plan.add_argument("--caption-tokens", **config_arg(PlanConfig, "caption_tokens"))
    from ..core.config import EditDataConfig

    plan.add_argument("--control-resolution", **config_arg(EditDataConfig, "control_resolution"))
    plan.set_defaults(func=cmd_plan)
    add_caption_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..core.errors import UserInputError

    try:
        args = build_parser().parse_args(argv)
        if args.func is cmd_demo:  # (train loads it once its processes agree: cmd_train)
            from .startup import load_engine

            load_engine()
        _quiet_libraries()
        return args.func(args)
    except UserInputError as e:  # the message says what is wrong and what to do: no traceback needed
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before training started (while training, train stops at a step boundary)
        print("interrupted before training started: checkpoints and the cache entries written so far are kept",
              file=sys.stderr)
        return 130
