"""The `demo` command: a small LoRA trained on a built-in model and dataset, or on model files.

Its flags are made as the other commands' (cli_args.py); `python -m trainer_core demo --help` lists them.
"""

from __future__ import annotations

import argparse

from .cli_args import blocks_to_swap_arg, check_writable_folder, config_arg, existing_path

# The demo's models: the shipped shapes model (the default: it learns a visible star), the tiny random text-to-image,
# a Qwen-Image-Edit variant (edit-auto: read from the files), 2.1 or Layered.
# The shipped small pretrained model: models/pretrained.NAME, spelled out here because this module imports no torch
# (tests/test_shapes_model.py checks the two agree).
SHAPES_MODEL = "qwen-image-shapes"
LAYERED = "qwen-image-layered"  # trainer_core/families/qwen_image_layered/
QWEN_IMAGE21 = "qwen-image-2.1"  # trainer_core/families/qwen_image21/
DEMO_MODELS = (SHAPES_MODEL, "qwen-image", "edit-2511", "edit-2509", "edit", QWEN_IMAGE21, LAYERED, "edit-auto")


def cmd_demo(args: argparse.Namespace) -> int:
    import torch

    from ..core.errors import UserInputError
    from .demo import run_demo

    files = (args.transformer, args.text_encoder, args.vae)
    components = None
    if args.model == QWEN_IMAGE21:  # its processor always comes from a 2.1 folder, its text encoder and VAE may too
        _check_demo21_files(args)
    elif any(files) and not all(files):
        raise UserInputError("demo from files needs all three of --transformer, --text-encoder and --vae.")
    elif args.diffusers_folder:
        raise UserInputError(f"--diffusers-folder is read for --model {QWEN_IMAGE21} only (its processor, and its "
                             f"text encoder and VAE when their files are not given): leave it out for {args.model}.")
    edit = args.model not in (SHAPES_MODEL, "qwen-image", QWEN_IMAGE21, LAYERED)  # Qwen-Image-Edit (trainer_core/families/qwen_image_edit/)
    if not any(files):  # the built-in models' block counts are known without loading anything
        _check_demo_blocks_to_swap(args.blocks_to_swap, _builtin_num_blocks(args.model))
    # Only after the flags' own checks, so that a refused command leaves no --out folder behind; before the
    # files load (minutes for real ones), so that an unwritable --out is said before any work.
    check_writable_folder(args.out, "--out")
    if any(files) and args.model == QWEN_IMAGE21:
        from ..families.recognise import load_recognised
        from ..models.source import FILES

        # As the built-in demo: float8 block weights, fp32 compute; the files ComfyUI gives (text_file.py, vae_file.py)
        components = load_recognised(FILES, torch.device("cpu"), storage="float8", compute_dtype="float32",
                                     transformer=args.transformer, text_encoder=args.text_encoder, vae=args.vae,
                                     diffusers_folder=args.diffusers_folder)
        print(f"model: {components.name} from {', '.join(str(f) for f in (*files, args.diffusers_folder) if f)}")
        _check_demo_blocks_to_swap(args.blocks_to_swap, components.num_blocks)
    elif any(files):
        from ..families.qwen_image import load_single_files
        from ..families.qwen_image_edit.files import load_edit_single_files
        from ..families.qwen_image_layered.files import load_layered_single_files

        # As the built-in demo: float8 block weights, fp32 compute (the CPU has no fast bf16 matmul).
        loader = (lambda *a, **k: load_edit_single_files(*a, variant=args.model, **k)) if edit else (
            load_layered_single_files if args.model == LAYERED else load_single_files)
        components = loader(*files, tokenizer_dir=args.tokenizer, storage="float8",
                            compute_dtype=torch.float32, text_encoder_fp8=args.text_encoder_fp8)
        print(f"model: {components.name} from {', '.join(files)}")
        _check_demo_blocks_to_swap(args.blocks_to_swap, components.num_blocks)
    # edit-auto without files: the tiny Edit-2511 (with files, the model set's own family decides).
    model = "edit-2511" if args.model == "edit-auto" else args.model
    result = run_demo(args.out, steps=args.steps, seed=args.seed, components=components, resume=args.resume,
                      blocks_to_swap=args.blocks_to_swap, model=model)
    print(f"loss: first step {result.first_loss:.4f}, last step {result.last_loss:.4f} ({result.steps} steps)")
    print(f"lora:      {result.lora}")
    if result.preview_before is not None:
        print(f"before:    {result.preview_before}")
    print(f"preview:   {result.preview}")
    print(f"loss plot: {result.loss_plot}")
    return 0


def _check_demo21_files(args: argparse.Namespace) -> None:
    """2.1 from files: the transformer file and the 2.1 folder its processor comes from (its text encoder and VAE
    from their files when given, else from the folder); a 2.1 folder alone is the folder's model."""
    from ..core.errors import UserInputError

    if (args.text_encoder or args.vae) and not args.transformer:
        raise UserInputError(f"demo --model {QWEN_IMAGE21}: --text-encoder and --vae go with a --transformer file; "
                             "give it too (or leave all three out for the built-in tiny 2.1).")
    if args.transformer and not args.diffusers_folder:
        raise UserInputError(f"demo --model {QWEN_IMAGE21} --transformer FILE: set --diffusers-folder to the diffusers "
                             "Qwen-Image 2.1 folder its processor comes from (and its text encoder and VAE, unless "
                             "--text-encoder and --vae give ComfyUI's files).")


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
    demo.add_argument("--steps", **config_arg(
        TrainStepsConfig, "steps", default=200, help="total optimizer steps (with --resume: up to this many)"))
    demo.add_argument("--out", default="demo_out", help="output folder (default demo_out)")
    demo.add_argument("--model", choices=DEMO_MODELS, default=DEMO_MODELS[0],
                      help="qwen-image-shapes (the small pretrained model that ships with the pack: the demo "
                           "teaches it stars), qwen-image (the tiny random text-to-image model), an edit model: edit-2511, edit-2509, edit (trains on the "
                           "built-in edit dataset with control images; with files: the variant they must be, "
                           "edit-auto = read it from the transformer file); qwen-image-2.1 (the tiny 2.1, text to "
                           "image), or qwen-image-layered (a composite and its RGBA layers)")
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
                      help=f"--model {QWEN_IMAGE21} with --transformer: the diffusers Qwen-Image 2.1 folder its processor "
                           "comes from (and its text encoder and VAE when --text-encoder and --vae are not given)")
    demo.set_defaults(func=cmd_demo)
