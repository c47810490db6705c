"""The `demo` command: a small LoRA trained on a built-in model and dataset, or on model files.

Its flags are made as the other commands' (cli_args.py); `python -m trainer_core demo --help` lists them.
"""

from __future__ import annotations

import argparse

from ..core.choices import EDIT_VARIANT_CHOICES
from ..families.registry import family_names
from .cli_args import blocks_to_swap_arg, check_writable_folder, config_arg, existing_path

# The demo's models: the shipped shapes model (the default: it learns a visible star), or a registered family's tiny
# model (with --transformer: its files), by name or alias (edit-auto: the Load Edit node's model read from the files,
# its Edit variant from the transformer file). The shipped small pretrained model: models/pretrained.NAME, spelled out
# here because this module imports no torch (tests/runs/test_shapes_model.py checks the two agree).
SHAPES_MODEL = "qwen-image-shapes"


def demo_models() -> tuple[str, ...]:
    """The demo's --model choices when the parser is made (a family registered before then is among them)."""
    return (SHAPES_MODEL, *family_names(aliases=True))


def cmd_demo(args: argparse.Namespace) -> int:
    from ..core.errors import UserInputError
    from .demo import run_demo

    files = (args.transformer, args.text_encoder, args.vae)
    components = None
    if (args.text_encoder or args.vae or args.diffusers_folder) and not args.transformer:
        raise UserInputError("demo from files: --text-encoder, --vae and --diffusers-folder go with a --transformer "
                             "file; give it too (or leave them all out for the built-in model).")
    if args.transformer and not args.diffusers_folder and not all(files):
        raise UserInputError("demo from files needs all three of --transformer, --text-encoder and --vae (a model "
                             "whose files read a diffusers folder for the rest: --diffusers-folder).")
    if not args.transformer:  # the built-in models' block counts are known without loading anything
        _check_demo_blocks_to_swap(args.blocks_to_swap, _builtin_num_blocks(args.model))
    else:  # a model set from files is lazy: its headers are read now, its weights when a phase needs them
        components = _load_demo_files(args)
        print(f"model: {components.name} from {', '.join(str(f) for f in (*files, args.diffusers_folder) if f)}")
        _check_demo_blocks_to_swap(args.blocks_to_swap, components.num_blocks)
    # Only after the flags' and the files' own checks, so that a refused command leaves no --out folder behind;
    # before any training work, so that an unwritable --out is said first.
    check_writable_folder(args.out, "--out")
    # (edit-auto without files: the tiny Edit model the Load Edit node builds; with files, the model set's own family)
    result = run_demo(args.out, steps=args.steps, seed=args.seed, components=components, resume=args.resume,
                      blocks_to_swap=args.blocks_to_swap, model=args.model)
    print(f"loss: first step {result.first_loss:.4f}, last step {result.last_loss:.4f} ({result.steps} steps)")
    print(f"lora:      {result.lora}")
    if result.preview_before is not None:
        print(f"before:    {result.preview_before}")
    print(f"preview:   {result.preview}")
    print(f"loss plot: {result.loss_plot}")
    return 0


def _load_demo_files(args: argparse.Namespace):
    """The model set of the demo's files, loaded as the Load node loads them (the Load Edit node for a family that
    trains on edit datasets only, or edit-auto), and refused when its family is not the one --model names (the
    default, the shapes model, names none: the files' own family trains)."""
    import torch

    from ..core.errors import UserInputError
    from ..data.edit_dataset import EDIT
    from ..families import get_family
    from ..families.loading import LoadRequest, load_model_set
    from ..models.source import FILES

    named = None if args.model == SHAPES_MODEL else get_family(args.model)
    edit = named is not None and tuple(named.dataset_kinds) == (EDIT,)  # loaded as the Load Edit node loads
    auto = EDIT_VARIANT_CHOICES[0]
    variant = args.model if args.model in EDIT_VARIANT_CHOICES else auto  # an alias (edit-auto): read from the files
    # As the built-in demo: float8 block weights, fp32 compute (the CPU has no fast bf16 matmul).
    components = load_model_set(LoadRequest(
        FILES, torch.device("cpu"), storage="float8", compute_dtype="float32", transformer=args.transformer,
        text_encoder=args.text_encoder, vae=args.vae, tokenizer=args.tokenizer, diffusers_folder=args.diffusers_folder,
        text_encoder_fp8=args.text_encoder_fp8, edit=edit, edit_variant=variant))
    if named is not None and components.family is not named and not (edit and variant == auto):
        raise UserInputError(f"demo --model {args.model}: the files are {components.family.display_name}'s "
                             f"({components.family.name}): name that model, or give {named.display_name}'s files.")
    return components


def _builtin_num_blocks(model: str) -> int:
    """The block count of the demo's built-in model `model` (the shipped shapes model or a tiny one)."""
    if model == SHAPES_MODEL:
        from ..models.pretrained import SHAPES_TRANSFORMER

        return SHAPES_TRANSFORMER["num_layers"]
    from ..models.tiny import TINY_TRANSFORMER

    return TINY_TRANSFORMER["num_layers"]


def _check_demo_blocks_to_swap(blocks_to_swap: int | str, num_blocks: int) -> None:
    from ..core.config import AUTO_SWAP
    from ..core.errors import UserInputError

    if blocks_to_swap != AUTO_SWAP and blocks_to_swap > num_blocks - 1:
        raise UserInputError(
            f"--blocks-to-swap {blocks_to_swap}: the transformer has {num_blocks} blocks and at least one must "
            f"stay on the GPU: use 0 to {num_blocks - 1}, or 'auto' to let the memory planner choose."
        )


def add_demo_parser(sub) -> None:
    """The demo command's flags, on the command line's subparsers `sub`."""
    from ..core.config import LoadConfig, TrainConfig, TrainStepsConfig

    demo = sub.add_parser("demo", help="train a small LoRA on a built-in model and dataset (default: teach the shipped "
                          "shapes model stars)")
    steps = config_arg(TrainStepsConfig, "steps", default=200, help="total optimizer steps (with --resume: up to this "
                       "many)")
    steps["type"] = _at_least_one(steps["type"])
    demo.add_argument("--steps", **steps)
    demo.add_argument("--out", default="demo_out", help="output folder (default demo_out)")
    demo.add_argument("--model", choices=demo_models(), default=SHAPES_MODEL,
                      help="qwen-image-shapes (the small pretrained model that ships with the pack: the demo "
                           "teaches it stars), or a model family's tiny random model: qwen-image (text-to-image), an "
                           "edit model: edit-2511, edit-2509, edit (trains on the built-in edit dataset with control "
                           "images; with files: the variant they must be, edit-auto = read it from the transformer "
                           "file), qwen-image-2.1 (text to image), or qwen-image-layered (a composite and its RGBA "
                           "layers)")
    demo.add_argument("--seed", **config_arg(TrainConfig, "seed", default=0))
    demo.add_argument("--blocks-to-swap", **blocks_to_swap_arg(default=1))
    demo.add_argument("--resume", action="store_true",
                      help="continue from the checkpoint in --out up to --steps total steps")
    demo.add_argument("--transformer", type=existing_path("file"),
                      help="train this transformer file (e.g. from export-tiny) instead of the built-in model; "
                           "needs --text-encoder and --vae too (qwen-image-2.1: --diffusers-folder, the two optional)")
    demo.add_argument("--text-encoder", type=existing_path("file"),
                      help="text encoder file (ComfyUI layout, bf16 or fp8_scaled)")
    demo.add_argument("--vae", type=existing_path("file"), help="VAE file (ComfyUI's Wan 2.1 layout)")
    demo.add_argument("--tokenizer", type=existing_path("folder"),
                      help="tokenizer folder (default: a tokenizer/ folder beside the text encoder file or its folder)")
    demo.add_argument("--text-encoder-fp8", **config_arg(LoadConfig, "text_encoder_fp8"))
    demo.add_argument("--diffusers-folder", type=existing_path("folder"),
                      help="with --transformer, for a model whose files read a diffusers folder (qwen-image-2.1: its "
                           "processor, and its text encoder and VAE when --text-encoder and --vae are not given)")
    demo.set_defaults(func=cmd_demo)


def _at_least_one(convert):
    """--steps of the demo: Train Steps' range, but from 1 (Train Steps' 0 means "cache only"; a demo trains)."""
    from ..core.config import TrainStepsConfig
    from ..core.fields import field_meta

    def at_least_one(text: str) -> int:
        try:
            below_one = int(text) < 1
        except ValueError:
            below_one = False  # Train Steps' check says what is wrong with it
        if below_one:
            raise argparse.ArgumentTypeError(f"{text} must be from 1 to {field_meta(TrainStepsConfig, 'steps')['max']}")
        return convert(text)

    at_least_one.__name__ = "int"
    return at_least_one
