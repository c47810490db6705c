"""Configuration of a training run, with validation and help text per field.

Each field carries `metadata`: `help` (shown as the tooltip of the matching node input), and, for
numbers, `min`/`max`/`step` (and `words`: values beside the range, such as blocks_to_swap's 'auto'); for
choices, `choices`; `multiline` for a text box; `file_list` (a ComfyUI model folder) for a file choice whose
list the node fills in at run time (`extra_choices` go first, the default is preselected when present). This is
the one source of every setting: node widgets and their tooltips (nodes/widgets.py), the command line's flags
(cli.py) and the planner's validation are all generated from it, so the engine, the canvas and the terminal never
disagree about ranges or meaning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .choices import (  # noqa: F401 (re-exported)
    ADAPTER_TYPES,
    COMPUTE_DTYPES,
    CUSTOM_FOLDER,
    EDIT_VARIANT_CHOICES,
    LORA_LAYOUTS,
    LORA_TARGET_PRESET_NAMES,
    MODEL_SOURCES,
    NO_LORA,
    NOT_USED,
    PLAN_STORAGE_MODES,
    SAVE_DTYPES,
    STORAGE_MODES,
    TEXT_ENCODER_FP8_MODES,
    TRANSPARENCY_CHOICES,
)
from .errors import UserInputError
from .fields import (  # noqa: F401 (re-exported: the settings' users import them from here)
    AUTO_SWAP,
    AUTO_SWAP_NUMBER,
    CHECKPOINTING_CHOICES,
    _check_choice,
    _check_range,
    _f,
    check_run_name,
    check_value,
    choices,
    config_field,
    field_default,
    field_meta,
    from_dict,
    help_text,
    parse_blocks_to_swap,
    parse_checkpointing,
    parse_colour,
    to_dict,
)


@dataclass
class DatasetConfig:
    folder: str = _f(
        "", "Folder of training images (png/jpg/jpeg/webp), each with a same-name .txt caption. A relative path is "
        "inside ComfyUI's input folder. Used when input_folder is '(custom path)'. '(example: coloured shapes)' is "
        "the 8-image example shipped with the nodes.")
    resolution: int = _f(
        1024, "Training resolution: buckets hold about resolution x resolution pixels, sides multiples of 32.",
        min=64, max=4096, step=32,
    )
    enable_buckets: bool = _f(True, "Group images by aspect ratio into buckets instead of square crops.")
    min_bucket_side: int = _f(256, "Smallest bucket side in pixels (multiple of 32).", min=32, max=4096, step=32)
    max_bucket_side: int = _f(2048, "Largest bucket side in pixels (multiple of 32).", min=32, max=8192, step=32)
    repeats: int = _f(1, "How many times each image appears per epoch.", min=1, max=1000)
    caption_extension: str = _f(".txt", "Extension of the caption file beside each image.")
    missing_caption: str = _f(
        "error", "What to do with an image that has no caption file: stop with an error, or train it with an "
        "empty caption.", choices=("error", "empty"),
    )
    upscale_small_images: bool = _f(
        False, "Upscale images smaller than their bucket. Off: such an image is an error that names it.",
    )
    background: str = _f(
        "white", "Colour that transparent pixels (alpha, palette or colour-key transparency) are composited onto: "
        "a colour name (white, black, gray, ...) or #RRGGBB.",
    )
    allow_large_images: bool = _f(
        False, "Open images over Pillow's decompression-bomb limit (about 89 megapixels). Off: such an image is an "
        "error that names it. Turn on only for images you trust.",
    )
    validation_images: int = _f(
        0, "Images held out of training for the validation loss (0 = none): that many, spread evenly over the "
        "images in file-name order; the summary names them. They are cached but never trained on.", min=0, max=10000,
    )
    loss_weight: float = _f(
        1.0, "How much this dataset's images count in the loss: each image's loss is multiplied by it (the mean over "
        "a micro-batch is over its images, so 0.5 makes them count half). 1 = as usual.", min=0.0, max=100.0,
        step=0.05,
    )
    is_regularization: bool = _f(
        False, "A regularisation set (class images, e.g. 'a photo of a person', that keep what the base model knows): "
        "its loss is reported on its own, and preservation_trigger is not looked for in its captions. How often its "
        "images come up is set by repeats, like any dataset's.",
    )
    input_folder: str = _f(
        CUSTOM_FOLDER, "A subfolder of ComfyUI's input folder to train on, or '(custom path)' to use the folder "
        "typed above.", folder_list="input", extra_choices=(CUSTOM_FOLDER,),
    )
    mask_background_weight: float = _f(
        0.1, "Loss masks: an image's mask is name_mask.png beside it or masks/name.png (white = train, black = "
        "background, grey between; colour counts by brightness, transparent as black). This is what black weighs: 0 = "
        "ignore the background, 1 = no masking, 0.1 (the default, as OneTrainer's unmasked_weight and ai-toolkit's "
        "mask_min_value in its UI) keeps a little of it. Images without a mask train everywhere.",
        min=0.0, max=1.0, step=0.01,
    )
    transparency: str = _f(
        "auto", "Transparent images: keep their transparency (the LoRA learns it: Qwen-Image 2.1 only, whose VAE "
        "encodes RGBA; a transparent reference keeps its alpha for the VAE, and its text encoder sees it over white, "
        "as 2.1's pipeline does), flatten them onto the background colour, or auto: keep for 2.1, flatten for the "
        "other models (their VAEs are RGB).", choices=TRANSPARENCY_CHOICES,
    )

    def __post_init__(self) -> None:
        self.validate()  # settings are checked once, where they are made

    def validate(self) -> None:
        _check_range(self, "resolution", "repeats", "min_bucket_side", "max_bucket_side", "validation_images",
                     "mask_background_weight", "loss_weight")
        _check_choice(self, "missing_caption")
        parse_colour(self.background)
        for name in ("resolution", "min_bucket_side", "max_bucket_side"):
            if getattr(self, name) % 32:
                raise UserInputError(f"dataset {name}={getattr(self, name)} must be a multiple of 32 pixels.")
        if self.min_bucket_side > self.max_bucket_side:
            raise UserInputError(
                f"dataset min_bucket_side={self.min_bucket_side} is larger than max_bucket_side="
                f"{self.max_bucket_side}: lower min_bucket_side or raise max_bucket_side."
            )


@dataclass
class LoraConfig:
    rank: int = _f(16, "LoRA rank (dimension). Higher learns more detail and takes more memory. LoHa: the rank of "
                   "each of its two products (the update's rank is up to rank squared). LoKr: the rank of the "
                   "decomposed Kronecker factors (a factor small enough is kept whole).", min=1, max=512)
    alpha: float = _f(
        16.0, "LoRA alpha. The update is scaled by alpha / rank; set it freely (not tied to rank). The same for LoKr "
        "and LoHa.", min=0.0, max=4096.0, step=0.5,
    )
    dropout: float = _f(0.0, "Dropout on the LoRA input during training (0 = off). LoRA only: LoKr and LoHa have "
                        "no input dropout.", min=0.0, max=0.9, step=0.01)
    targets: str = _f(
        "attention+mlp", "Which Linear layers of each block get a LoRA: attention only, attention and MLPs, or all "
        "14 (adds the modulation layers).", choices=LORA_TARGET_PRESET_NAMES,
    )
    dtype: str = _f(
        "float32", "Precision of the trainable LoRA weights. float32 keeps every small update; bfloat16 halves "
        "their memory but rounds small updates away.", choices=("float32", "bfloat16"),
    )
    adapter: str = _f(
        "lora", "Adapter type (peft). lora: B @ A, the common choice. lokr (LyCORIS LoKr): each weight's update is a "
        "Kronecker product w1 x w2 of two small matrices: far fewer parameters for the same size, good for styles "
        "and small files. loha (LyCORIS LoHa): the elementwise product of two rank-`rank` products, rank up to "
        "rank squared at twice LoRA's parameters: more expressive per parameter. ComfyUI's LoRA loader reads all "
        "three.", choices=ADAPTER_TYPES,
    )
    lokr_factor: int = _f(
        -1, "LoKr: the size of w1, the small Kronecker factor: each side of a weight (out, in) is split into a "
        "divisor as close to this as possible and the rest (w2). -1: near the square root, the fewest parameters. "
        "Larger factors move parameters into w1.", min=-1, max=4096,
    )
    lokr_decompose_both: bool = _f(
        False, "LoKr: also write w1 as a rank-`rank` product (w1_a @ w1_b) when that is smaller; w2 always is, "
        "unless it is small enough to keep whole.",
    )

    def __post_init__(self) -> None:
        self.validate()  # settings are checked once, where they are made

    def validate(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 1:
            raise UserInputError(f"LoRA rank={self.rank} must be a whole number of at least 1 (try 16 or 32).")
        if not math.isfinite(self.alpha) or self.alpha <= 0:
            raise UserInputError(f"LoRA alpha={self.alpha} must be a positive number (often equal to the rank).")
        if isinstance(self.lokr_factor, bool) or not isinstance(self.lokr_factor, int) \
                or self.lokr_factor == 0:
            raise UserInputError(f"LoRA lokr_factor={self.lokr_factor!r} must be -1 (near the square root) or a "
                                 "whole number of at least 1 (try 8 or 16).")
        _check_range(self, "rank", "dropout", "lokr_factor")
        _check_choice(self, "targets", "dtype", "adapter")
        if self.adapter != "lora" and self.dropout > 0:
            raise UserInputError(f"LoRA dropout={self.dropout} with adapter={self.adapter}: dropout is LoRA's input "
                                 "dropout, and peft's LoKr and LoHa have none. Set dropout to 0, or adapter to lora.")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


# automagic keeps every value's learning rate within these bounds (training/automagic.py: its published defaults).
AUTOMAGIC_MIN_LR, AUTOMAGIC_MAX_LR = 1e-7, 1e-3


@dataclass
class OptimizerConfig:
    optimizer: str = _f(
        "adamw8bit", "adamw8bit (bitsandbytes): AdamW with 1/4 of its state memory, the safe default. adamw "
        "(torch): full-precision states. adamw_kahan (optimi): AdamW with Kahan summation, so bfloat16 LoRA weights "
        "keep small updates (pick it with LoRA dtype bfloat16). prodigy: estimates its own step size; set "
        "learning_rate 1.0 (a multiplier). schedulefree_adamw: no schedule needed (keep it constant); previews and "
        "saves use its averaged weights. came: Adafactor-like factored states, about half of AdamW's memory. "
        "automagic: a learning rate per weight value that grows while updates agree and shrinks when they flip, "
        "starting at learning_rate (try 1e-5; bounds 1e-7..1e-3).",
        choices=("adamw8bit", "adamw", "adamw_kahan", "prodigy", "schedulefree_adamw", "came", "automagic"),
    )
    learning_rate: float = _f(1e-4, "Peak learning rate.", min=1e-8, max=1.0, step=1e-6)
    beta1: float = _f(0.9, "Adam beta1.", min=0.0, max=0.9999, step=0.001)
    beta2: float = _f(0.999, "Adam beta2.", min=0.0, max=0.99999, step=0.0001)
    eps: float = _f(1e-8, "Adam epsilon.", min=1e-12, max=1e-3, step=1e-9)
    weight_decay: float = _f(0.01, "Decoupled weight decay on the LoRA weights.", min=0.0, max=1.0, step=0.001)
    warmup_steps: int = _f(0, "Steps of linear warm-up from 0 to the learning rate.", min=0, max=100000)
    schedule: str = _f(
        "constant", "Learning rate after warm-up: constant, or cosine decay to min_lr_ratio over schedule_steps.",
        choices=("constant", "cosine"),
    )
    schedule_steps: int = _f(
        1000, "Length of the cosine schedule in steps (the run's planned total). Ignored for constant.",
        min=1, max=1000000,
    )
    min_lr_ratio: float = _f(0.0, "Cosine schedule floor, as a fraction of the learning rate.", min=0.0, max=1.0, step=0.01)
    max_grad_norm: float = _f(1.0, "Clip the gradient norm to this value (0 = no clipping).", min=0.0, max=1000.0, step=0.1)
    ema: bool = _f(
        False, "Also keep an exponential moving average (EMA) of the LoRA weights, updated after every step (float32: "
        "one more LoRA-sized copy on the GPU). Save and snapshots then also write name_ema.safetensors; Preview's "
        "weights input samples either. Often smoother than the last step's weights.")
    ema_decay: float = _f(
        0.999, "EMA decay: the share of the average each step keeps (0.999 averages over about the last 1000 steps; "
        "0 = the raw weights). Early steps use min(decay, (1 + n) / (10 + n)), as OneTrainer and ai-toolkit do.",
        min=0.0, max=0.99999, step=0.0001)

    def __post_init__(self) -> None:
        self.validate()  # settings are checked once, where they are made

    def validate(self) -> None:
        if not math.isfinite(self.learning_rate) or self.learning_rate <= 0:
            raise UserInputError(
                f"optimizer learning_rate={self.learning_rate} must be a positive number (LoRAs train well "
                "around 1e-4)."
            )
        _check_range(self, "learning_rate", "beta1", "beta2", "eps", "weight_decay", "warmup_steps",
                     "schedule_steps", "min_lr_ratio", "max_grad_norm", "ema_decay")
        _check_choice(self, "optimizer", "schedule")
        if self.ema and self.optimizer == "schedulefree_adamw":
            raise UserInputError("ema with optimizer schedulefree_adamw: schedule-free AdamW averages its weights "
                                 "already (previews and saves use that average); turn ema off or choose another "
                                 "optimizer.")
        if self.optimizer == "automagic" and not AUTOMAGIC_MIN_LR <= self.learning_rate <= AUTOMAGIC_MAX_LR:
            # Every value's rate starts at learning_rate and is kept within the bounds from its first bump on: the
            # first step would run at the asked rate and every later one at a bound.
            raise UserInputError(
                f"optimizer automagic with learning_rate={self.learning_rate}: automagic starts each weight's rate at "
                f"learning_rate and keeps it within {AUTOMAGIC_MIN_LR:g}..{AUTOMAGIC_MAX_LR:g}, so only its first step "
                f"would run at {self.learning_rate:g}. Set learning_rate within those bounds (try 1e-5).")
        if self.optimizer == "prodigy" and self.learning_rate < 0.01:
            # Prodigy's step is learning_rate x its own estimate d: 1e-4 there would leave the LoRA almost unchanged.
            raise UserInputError(
                f"optimizer prodigy with learning_rate={self.learning_rate}: Prodigy estimates its own step size and "
                "learning_rate multiplies it; set learning_rate to 1.0 (0.5 for a gentler run).")


@dataclass
class TrainConfig:
    run_name: str = _f("qwen_lora", "Name of this run: the trainer, its checkpoints and its LoRA files use it.")
    micro_batch_size: int = _f(1, "Images per forward pass (all from one aspect bucket).", min=1, max=64)
    grad_accum_steps: int = _f(1, "Micro-batches summed into one optimizer step.", min=1, max=1024)
    # One of CHECKPOINTING_CHOICES; true/false (a run file or workflow from before 'auto') read as on/off.
    gradient_checkpointing: str = _f(
        "auto", "Recompute blocks' activations in backward instead of keeping them: much less memory, about a third "
        "more block compute for each block that recomputes. auto = only as many blocks as the GPU's free memory needs, "
        "from the memory plan (none on a card with room to spare; every block when any block is swapped, on a CPU or "
        "when the budget is unknown); on = every block; off = none. The status says how many recompute.",
        choices=CHECKPOINTING_CHOICES)
    # A count or AUTO_SWAP. The default and range are the widget's and the flag's, where -1 spells auto: a made
    # config holds AUTO_SWAP (parse_blocks_to_swap, in __post_init__), and what the engine decides from it is the
    # trainer's (training.setup.Decided), never written back here.
    blocks_to_swap: int | str = _f(
        AUTO_SWAP_NUMBER, "Transformer blocks whose frozen weights stay in CPU RAM and are copied to the GPU when "
        "needed (slower, less VRAM). -1 (or 'auto') = auto: the fewest that fit the GPU's free memory, from the memory "
        "plan; on a CPU nothing is swapped.", min=AUTO_SWAP_NUMBER, max=1000, words=(AUTO_SWAP,),
    )
    seed: int = _f(42, "Seed for LoRA initialisation, data order, noise and timesteps.", min=0, max=2**31 - 1)
    timestep_sampling: str = _f(
        "logit_normal", "How noise levels are drawn: logit-normal (favours the middle) or uniform.",
        choices=("logit_normal", "uniform"),
    )
    logit_mean: float = _f(0.0, "Mean of the logit-normal timestep draw.", min=-5.0, max=5.0, step=0.1)
    logit_std: float = _f(1.0, "Standard deviation of the logit-normal timestep draw.", min=0.1, max=5.0, step=0.1)
    resolution_shift: bool = _f(
        True, "Shift noise levels by image size exactly as Qwen-Image's scheduler does at inference.",
    )
    caption_dropout: float = _f(
        0.0, "Probability of training a step's image with the empty caption.", min=0.0, max=1.0, step=0.01,
    )
    preservation_weight: float = _f(
        0.0, "Differential output preservation (needs preservation_trigger and preservation_class on the Cache node): "
        "for every image whose caption has the trigger, the LoRA's prediction for the class caption is pulled "
        "towards the base model's at the same noisy latent, with this weight (ai-toolkit's DOP). Costs one more "
        "forward without gradient and a larger training forward. 0 = off.", min=0.0, max=100.0, step=0.05,
    )
    checkpoint_every: int = _f(
        100, "Also write a resumable checkpoint every N steps (0 = only at the end of each Train Steps run and "
        "on cancel).", min=0, max=1000000,
    )
    max_nonfinite_steps: int = _f(
        3, "Skip a step whose loss or gradient is NaN/inf; after this many in a row, stop and keep the last good "
        "LoRA.", min=1, max=1000,
    )
    validation_every: int = _f(
        0, "Measure the validation loss every N steps (0 = off): the images the Dataset node holds out, each at "
        "fixed noise levels with fixed noise, so values compare across steps. Plotted with the training loss.",
        min=0, max=1000000,
    )
    fp8_activations: bool = _f(
        False, "Experimental: the float8 block weights multiply in float8 (torch._scaled_mm; activations scaled per "
        "token) instead of being copied to bfloat16 for each matmul: faster on GPUs with float8 tensor cores (RTX "
        "40xx/50xx, H100), slightly less exact (benchmarks/README.md). Backward stays bfloat16. Needs float8 or "
        "float8_scaled storage and bfloat16 compute; otherwise, or on a GPU without float8, it changes nothing "
        "(the status says whether it is on).",
    )
    compile_float8: bool = _f(
        False, "Experimental, and slower today: measured on an H100 at 1024², 1.54 s a step against the eager path's "
        "1.06 (benchmarks/device_results/h100_2026-12-06.md); kept for measuring, not for speed. It compiles the "
        "float8 block Linears (torch.compile with Triton, CUDA GPUs of the RTX 30xx generation or newer) so each "
        "matmul reads the float8 weight as it is instead of a bfloat16 copy made per call: less memory traffic, "
        "same results up to rounding. The first step compiles (up to a minute). Not "
        "together with fp8_activations. Without Triton or on the CPU it changes nothing (the status says whether "
        "it is on).",
    )
    int8_compute: bool = _f(
        False, "Experimental, opt-in until measured on a GPU: the block Linears multiply int8 activations (scaled per "
        "token, Hadamard-rotated as ComfyUI's int8 ConvRot does) by int8 weights (torch._int_mm): int8 tensor cores "
        "are 2-4x bfloat16's (RTX 40xx/50xx, H100). float8 and bfloat16 weights are rotated and quantised to int8 once "
        "at load; an int8 ConvRot file's are used as they are. Backward stays in the compute dtype; the LoRA is "
        "unchanged. Slightly less exact (benchmarks/README.md). Not together with fp8_activations or compile_float8 "
        "(the status says whether it is on).",
    )
    fused_blocks: str = _f(
        "auto", "How a Qwen-Image block's small work runs (QK norm and rotary embedding, modulation, gates, "
        "residuals; models/fused_block.py): auto = diffusers' own block until a GPU has measured ours (speed and "
        "memory); eager = our fused functions uncompiled; compiled = compiled with torch.compile on a CUDA GPU with Triton (the first "
        "step compiles), else eager; "
        "off = diffusers' own block. The same results up to rounding; the status says which runs.",
        choices=("auto", "eager", "compiled", "off"),
    )
    attention_backend: str = _f(
        "auto", "The attention kernel (models/attention_backend.py): auto = the GPU's best (cuDNN on H100 / B200 "
        "class cards, FlashAttention-3 or -2 where installed, else PyTorch's flash kernel); sdpa = PyTorch's own "
        "pick; or one by name. Text without padding runs without a mask. The status says which runs.",
        choices=("auto", "sdpa", "cudnn", "flash", "efficient", "math", "flash_attn_3", "flash_attn_2"),
    )

    def __post_init__(self) -> None:
        self.blocks_to_swap = parse_blocks_to_swap(self.blocks_to_swap)
        self.gradient_checkpointing = parse_checkpointing(self.gradient_checkpointing)
        self.validate()  # settings are checked once, where they are made

    @property
    def auto_swap(self) -> bool:
        return self.blocks_to_swap == AUTO_SWAP

    @property
    def checkpointing(self) -> bool:
        """Whether any block may recompute ('auto' or 'on'); how many: the memory plan (planner.for_run)."""
        return self.gradient_checkpointing != "off"

    @property
    def auto_checkpointing(self) -> bool:
        return self.gradient_checkpointing == "auto"

    def validate(self) -> None:
        _check_range(self, "micro_batch_size", "grad_accum_steps", "seed", "caption_dropout", "checkpoint_every",
                     "max_nonfinite_steps", "blocks_to_swap", "validation_every", "preservation_weight")
        _check_choice(self, "timestep_sampling", "fused_blocks", "attention_backend", "gradient_checkpointing")
        check_run_name(self.run_name)
        if self.compile_float8 + self.fp8_activations + self.int8_compute > 1:
            raise UserInputError(
                "compile_float8, fp8_activations and int8_compute are alternative ways to multiply the one-byte "
                "block weights: turn all but one of them off.")

    def check_model(self, num_blocks: int) -> None:
        """What the settings can only be checked against once the model is known."""
        if not self.auto_swap and self.blocks_to_swap > num_blocks - 1:
            raise UserInputError(
                f"blocks_to_swap={self.blocks_to_swap} is too large: the transformer has {num_blocks} blocks and "
                f"at least one must stay on the GPU. Use at most {num_blocks - 1}."
            )


# The settings of the other nodes and commands (command_config.py), imported from here by their users.
from .command_config import (  # noqa: E402, F401
    InitConfig,
    LoadConfig,
    EditLoadConfig,
    EditDataConfig,
    CacheConfig,
    TrainStepsConfig,
    PreviewConfig,
    CompareStepsConfig,
    LossPlotConfig,
    SaveConfig,
    PlanConfig,
    HeadlessConfig,
    CaptionConfig,
)
