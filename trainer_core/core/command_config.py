"""The settings of the nodes and commands around a training run (Init, Load, Cache, Train Steps, Preview, Compare
Steps, Loss Plot, Save, Caption Dataset, plan, train --config, caption), in the same form as config.py's run settings:
a field with its help and range, checked once when made. config.py re-exports them: import them from there."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from .choices import (
    CAPTION_STYLES,
    COMPUTE_DTYPES,
    CUSTOM_FOLDER,
    EDIT_VARIANT_CHOICES,
    LORA_LAYOUTS,
    MODEL_SOURCES,
    NO_LORA,
    NOT_USED,
    PLAN_STORAGE_MODES,
    PLAN_TEXT_ENCODER_FILES,
    SAVE_DTYPES,
    STORAGE_MODES,
    TEXT_ENCODER_FP8_MODES,
)
from .errors import UserInputError
from .fields import _check_choice, _check_range, _f, choices


def control_character(text: str, allowed: str = "") -> tuple[int, str] | None:
    """(position, character) of `text`'s first control character (Unicode's Cc: NUL, ESC, DEL, C1; the line and
    paragraph separators U+2028, U+2029) not in `allowed`, or None."""
    for i, ch in enumerate(text):
        if ch not in allowed and unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
            return i, ch
    return None


@dataclass
class InitConfig:
    """Init Trainer settings that are not part of the run's TrainConfig (which is stored in checkpoints and
    compared between runs)."""

    continue_from_lora: str = _f(
        NO_LORA, "Start from this LoRA file (ComfyUI, diffusers or kohya/musubi layout) instead of from zero. Its "
        "rank, alpha and layers replace the LoRA Config's; optimizer and steps start fresh.",
        file_list="loras", extra_choices=(NO_LORA,),
    )


@dataclass
class LoadConfig:
    """How the Qwen-Image parts are loaded (the Load node)."""

    source: str = _f(
        MODEL_SOURCES[0], "Where the model comes from: the three files below, a diffusers-format folder, the tiny "
        "random model used for tests, or the small pretrained shapes model (draws coloured shapes: the first-run "
        "workflow's).", choices=MODEL_SOURCES,
    )
    # The file choices list ComfyUI's model folders (filled in by the node); the default is preselected
    # when present: the file names of ComfyUI's repackaged Qwen-Image.
    transformer: str = _f(
        "qwen_image_fp8_e4m3fn.safetensors", "Qwen-Image transformer file from models/diffusion_models "
        "(qwen_image_fp8_e4m3fn or qwen_image_bf16; Qwen-Image-2512's qwen_image_2512_fp8_e4m3fn too; Qwen-Image "
        "2.1's qwen_image_2.1_int8_convrot or its Turbo's, whose processor then comes from diffusers_folder).",
        file_list="diffusion_models", extra_choices=(NOT_USED,),
    )
    text_encoder: str = _f(
        "qwen_2.5_vl_7b_fp8_scaled.safetensors", "Text encoder from models/text_encoders: Qwen2.5-VL 7B "
        "(qwen_2.5_vl_7b_fp8_scaled or qwen_2.5_vl_7b), or Qwen-Image 2.1's Qwen3-VL-8B (qwen3vl_8b_int8_convrot).",
        file_list="text_encoders", extra_choices=(NOT_USED,),
    )
    vae: str = _f("qwen_image_vae.safetensors", "VAE from models/vae (qwen_image_vae; Layered's "
                  "qwen_image_layered_vae; 2.1's qwen_image_2.1_vae_bf16).", file_list="vae", extra_choices=(NOT_USED,))
    diffusers_folder: str = _f(
        "", "Path of a diffusers Qwen-Image folder (with transformer/, vae/, text_encoder/, tokenizer/). Used when "
        "source is 'diffusers folder', and with a Qwen-Image 2.1 transformer file: the 2.1 folder its processor "
        "comes from (and its text encoder or VAE when that is set to (not used)).",
    )
    storage: str = _f(
        "float8", "How the transformer's block weights are stored: float8 (half of bf16's memory), float8_scaled "
        "(a scale per row: more accurate), or bfloat16/float32. A file's own one-byte weights (fp8, or ComfyUI's "
        "int8 ConvRot) are kept as the file has them under either float8 mode.", choices=STORAGE_MODES,
    )
    compute_dtype: str = _f(
        "auto", "Precision of the computation: auto is bfloat16 on a GPU, float32 on a CPU.", choices=COMPUTE_DTYPES,
    )
    text_encoder_fp8: str = _f(
        "auto", "An fp8-scaled or int8 text encoder: dequantize to the compute dtype while loading (faster caching), "
        "or keep its one-byte weights (half the memory while caching). auto: keep them only when the dequantized "
        "encoder would not fit the GPU's free memory (the memory plan's caching phase).",
        choices=TEXT_ENCODER_FP8_MODES,
    )


@dataclass
class EditDataConfig:
    control_resolution: int = _f(
        0, "Size of the control images the model sees, as the side of a square of the same area (sides multiples "
        "of 32, each control keeps its aspect ratio). 0 = the edit model's own rule: about 1024x1024 px for the "
        "VAE and 384x384 px for the text encoder's view (Edit-2509/2511); Qwen-Image 2.1's reference images: one "
        "size for both, 1024x1024 px of area at 0, and 256 or more (Qwen3-VL enlarges smaller images). Smaller "
        "trains faster with less memory.",
        min=0, max=4096, step=32,
    )

    def validate(self) -> None:
        _check_range(self, "control_resolution")
        if self.control_resolution and self.control_resolution < 64:
            raise UserInputError(f"control_resolution={self.control_resolution} is too small: use 0 (the model's "
                                 "rule) or 64 and more.")


@dataclass
class EditLoadConfig(LoadConfig):
    """How a Qwen-Image-Edit model set is loaded (the Load Edit node): the Load node's settings, an Edit
    transformer preselected, and the variant."""

    transformer: str = _f(
        "qwen_image_edit_2511_fp8_e4m3fn.safetensors", "Qwen-Image-Edit transformer file from models/diffusion_models "
        "(qwen_image_edit_2511_*, qwen_image_edit_2509_* or qwen_image_edit_*; fp8 or bf16).",
        file_list="diffusion_models", extra_choices=(NOT_USED,),
    )
    text_encoder: str = _f(
        "qwen_2.5_vl_7b_fp8_scaled.safetensors", "Qwen2.5-VL 7B text encoder from models/text_encoders, with its vision "
        "tower (qwen_2.5_vl_7b_fp8_scaled has it): the edit model sees the control images through it.",
        file_list="text_encoders", extra_choices=(NOT_USED,),
    )
    edit_variant: str = _f(
        "auto", "Which Qwen-Image-Edit model the transformer is: auto reads it from the file (Edit-2511 by its "
        "marker key, Edit-2509 by '2509' in the name or the folder's pipeline class, else Edit).",
        choices=EDIT_VARIANT_CHOICES,
    )


@dataclass
class CacheConfig:
    """The latent / prompt cache (the Cache node)."""

    preview_prompts: str = _f(
        "", "One prompt per line for the Preview node. They are encoded now, because the text encoder is freed "
        "after caching.", multiline=True,
    )
    negative_prompt: str = _f("", "Negative prompt for previews (CFG).")
    preservation_trigger: str = _f(
        "", "Differential output preservation: the trigger word(s) in your captions, e.g. 'sks person'. Each caption "
        "that contains it is also encoded with it replaced by preservation_class, so training can keep the base "
        "model's picture of the class (preservation_weight on Init Trainer). Empty: off.",
    )
    preservation_class: str = _f(
        "", "The class word the trigger stands for, e.g. 'person' for 'sks person': what the base model should keep "
        "drawing as it did. Needed when preservation_trigger is set.",
    )
    caching_batch_size: int = _f(4, "Images or prompts per progress update. Each is encoded alone, so a cached "
                                    "entry never depends on which others were encoded with it.", min=1, max=64)
    cache_folder: str = _f(
        "", "Folder inside ComfyUI's output folder for the cache. Empty: qwen_lora_training/cache. Entries are "
        "keyed by content, so one folder serves many datasets and models.",
    )

    def __post_init__(self) -> None:
        self.validate()  # settings are checked once, where they are made

    def validate(self) -> None:
        trigger, word = self.preservation_trigger.strip(), self.preservation_class.strip()
        if trigger and not word:
            raise UserInputError(
                f"preservation_trigger={self.preservation_trigger!r} is set but preservation_class is empty: name the "
                "class the trigger stands for (e.g. 'person' for 'sks person'), or clear the trigger.")
        if word and not trigger:
            raise UserInputError(
                f"preservation_class={self.preservation_class!r} is set but preservation_trigger is empty: give the "
                "trigger word(s) your captions use (e.g. 'sks person'), or clear the class.")
        if trigger and trigger == word:
            raise UserInputError(
                f"preservation_trigger and preservation_class are both {trigger!r}: the class caption would be the "
                "caption itself. Use the class word the trigger stands for (e.g. 'sks person' -> 'person').")


@dataclass
class TrainStepsConfig:
    """One Train Steps execution."""

    steps: int = _f(100, "How many optimizer steps this execution trains. 0 = none: the queue captions, caches and "
                         "builds the trainer only (e.g. to read the captions first); Save LoRA then writes nothing.",
                    min=0, max=1_000_000)
    preview_every: int = _f(
        0, "Every N steps, sample the Cache node's first preview prompt (seed 0, CFG 4: the Preview node's defaults) "
        "and show it on this node beside the loss plot while it trains; kept for Compare Steps. 0 = off.",
        min=0, max=1_000_000,
    )
    preview_size: int = _f(512, "Width and height of those previews (smaller is faster).", min=64, max=2048, step=32)
    preview_sampling_steps: int = _f(20, "Sampling steps of those previews (fewer is faster).", min=1, max=200)
    snapshot_every: int = _f(
        0, "Every N steps, also save the LoRA into the loras folder as {run_name}_{step} (ComfyUI layout, bfloat16), "
        "so ComfyUI's own LoRA loaders can try it. 0 = off.", min=0, max=1_000_000,
    )

    def __post_init__(self) -> None:
        self.validate()  # settings are checked once, where they are made

    def validate(self) -> None:
        _check_range(self, "steps", "preview_every", "preview_size", "preview_sampling_steps", "snapshot_every")


@dataclass
class PreviewConfig:
    """A preview image sampled with the live adapter (the Preview node)."""

    prompt: str = _f("", "A preview prompt cached by the Cache node; empty: the first one.", multiline=True)
    width: int = _f(1024, "Image width.", min=64, max=4096, step=32)
    height: int = _f(1024, "Image height.", min=64, max=4096, step=32)
    steps: int = _f(20, "Sampling steps.", min=1, max=200)
    cfg: float = _f(4.0, "True CFG scale against the cached negative prompt (1 = off).", min=1.0, max=20.0, step=0.1)
    preview_seed: int = _f(0, "Noise seed of the preview; keep it fixed to compare steps.", min=0, max=2**31 - 1)
    weights: str = _f("raw", "Sample the LoRA's weights as trained (raw), or their EMA (the Optimizer node's ema).",
                      choices=("raw", "ema"))


@dataclass
class CompareStepsConfig:
    """The grid of live previews by step (the Compare Steps node)."""

    columns: int = _f(0, "Tiles per row; 0 = about square.", min=0, max=64)
    tile_size: int = _f(256, "Longest side of each tile in pixels.", min=64, max=512, step=32)


@dataclass
class LossPlotConfig:
    width: int = _f(768, "Plot width in pixels.", min=256, max=4096)
    height: int = _f(384, "Plot height in pixels.", min=128, max=4096)


@dataclass
class SaveConfig:
    """Writing the LoRA file (the Save node)."""

    filename: str = _f(
        "{run_name}_{step}", "File name inside the loras folder; {run_name} and {step} are filled in (the only "
        "placeholders; {{ and }} for literal braces). Subfolders allowed ('/' or '\\').",
    )
    dtype: str = _f("bfloat16", "Precision of the saved weights.", choices=SAVE_DTYPES)
    layout: str = _f(
        "comfyui", "Key layout: comfyui (diffusion_model.* + alpha; ComfyUI and diffusers load it), kohya "
        "(lora_unet_*; kohya/musubi tools), diffusers (transformer.*, alpha folded in).", choices=LORA_LAYOUTS,
    )


@dataclass
class PlanConfig:
    """Settings only the memory planner takes (`python -m trainer_core plan`); the rest of a planned run comes
    from the LoRA, optimizer and train configs."""

    width: int = _f(1024, "Image width in pixels (a bucket side: multiple of 32).", min=32, max=8192, step=32)
    height: int = _f(1024, "Image height in pixels (a bucket side: multiple of 32).", min=32, max=8192, step=32)
    storage: str = _f(
        "float8", "How the transformer's block weights are stored during training (as the Load node's storage; "
        "the planner covers the float8 and bfloat16 modes, and int8: an int8 ConvRot file such as "
        "qwen_image_2.1_int8_convrot kept as it is).", choices=PLAN_STORAGE_MODES,
    )
    budget_gb: float = _f(
        24.0, "GPU memory budget in GiB: the planner picks the fewest swapped blocks that fit it.",
        min=1.0, max=4096.0, step=0.5,
    )
    text_tokens: int = _f(256, "Prompt tokens per sample (the longest caption in a batch).", min=0, max=1024)
    dataset_images: int = _f(0, "Dataset images whose cached latents and prompts stay in host RAM.",
                             min=0, max=10_000_000)
    text_encoder_storage: str = _f(
        "auto", "How the text encoder sits in memory while caching (float8: its one-byte file's Linears kept, the "
        "Load node's text_encoder_fp8 = keep); auto: bfloat16 when it fits the GPU budget, else float8.",
        choices=("auto", "bfloat16", "float8"),
    )
    text_encoder_file: str = _f(
        "auto", "The text encoder file: bf16, fp8 (qwen_2.5_vl_7b_fp8_scaled) or int8 (qwen3vl_8b_int8_convrot); "
        "auto: the file ComfyUI's templates download for the model (Qwen-Image fp8, Qwen-Image 2.1 int8).",
        choices=("auto", *PLAN_TEXT_ENCODER_FILES),
    )
    ram_gb: float = _f(
        0.0, "Host RAM of the training machine in GiB: every phase (loading, caching, training, previews, saving) "
        "is checked against it, less 4 GiB for the system. 0: not checked.", min=0.0, max=65536.0, step=0.5,
    )
    preview_size: int = _f(
        1024, "Width and height of the previews to plan for (the Preview node's size).", min=64, max=4096, step=32,
    )
    references: int = _f(
        0, "Qwen-Image 2.1 editing: reference images per sample (square, sized by control_resolution). Their tokens "
        "lengthen the training and preview sequences; caching adds the vision tower's forward and their encodes.",
        min=0, max=10,
    )
    caption_tokens: int = _f(
        320, "With --caption: the longest caption the captioning phase plans, in new tokens (its KV cache grows by "
        "each; the captioner's longest style default, detailed, is 320).", min=1, max=4096,
    )


@dataclass
class HeadlessConfig:
    """Settings only `python -m trainer_core train` takes: in the canvas, queueing, the Save node and ComfyUI's
    folders do these jobs. Relative paths are relative to the folder of the run file."""

    steps: int = _f(
        1000, "Total optimizer steps of the run: training stops there, and running the same command again "
        "resumes up to it. 0 = no step limit (epochs decides).", min=0, max=100_000_000,
    )
    epochs: int = _f(
        0, "Stop after this many passes over the dataset (every image times its repeats). 0 = no epoch limit "
        "(steps decides); with both, whichever comes first.", min=0, max=1_000_000,
    )
    output_folder: str = _f(
        "output", "Folder of the run's files: <folder>/<run_name>/ holds its checkpoints, LoRA files, previews and "
        "loss plot, <folder>/cache the latent and prompt cache (shared by runs).",
    )
    snapshot_every_epochs: int = _f(
        0, "Also save the LoRA after every N epochs (0 = off), as snapshot_every does for steps.", min=0,
        max=1_000_000,
    )
    tokenizer: str = _f(
        "", "Qwen2.5 tokenizer folder for model files. Empty: a tokenizer/ folder beside the text encoder file (or "
        "its folder), as export-tiny writes.",
    )

    def __post_init__(self) -> None:
        self.validate()  # settings are checked once, where they are made

    def validate(self) -> None:
        _check_range(self, "steps", "epochs", "snapshot_every_epochs")
        if not self.steps and not self.epochs:
            raise UserInputError("[train] steps and epochs are both 0: set how long to train (steps = 1000, say).")


# Seed of the `caption` settings that decodes greedily: the same captions every time (a seed samples).
GREEDY = -1


@dataclass
class CaptionConfig:
    """Captions written by the text encoder file's own vision-language model (the Caption Dataset node, `python -m
    trainer_core caption`; trainer_core/captions)."""

    folder: str = _f(
        "", "Dataset folder to caption: each image without a same-name .txt caption gets one written beside it (mask "
        "images, masks/ and an edit dataset's _control images are left out).",
    )
    text_encoder: str = _f(
        "qwen_2.5_vl_7b_fp8_scaled.safetensors", "Text encoder file from models/text_encoders whose vision-language "
        "model writes the captions: Qwen2.5-VL 7B (qwen_2.5_vl_7b_fp8_scaled or qwen_2.5_vl_7b: Qwen-Image, Edit, "
        "Layered) or Qwen-Image 2.1's Qwen3-VL-8B (qwen3vl_8b_*). ComfyUI's files carry the vision tower and the "
        "output layer it needs; nothing is downloaded.", file_list="text_encoders",
    )
    style: str = _f(
        CAPTION_STYLES[0], "short: one line naming the subject; detailed: a description of subject, setting, colours, "
        "light and style; tags: comma-separated tags; edit (an Edit Dataset's folder): the instruction that turns "
        "each image's control images (name_control.png, ...) into it, the model shown the controls, then the image.",
        choices=CAPTION_STYLES,
    )
    instruction: str = _f(
        "", "What the model is asked, instead of the style's own instruction (empty: the style's). {trigger} in it "
        "becomes the trigger word.", multiline=True,
    )
    trigger: str = _f(
        "", "Trigger word put in every caption: where the caption says {trigger}, else before it ('ohwx, a woman "
        "reading'). Empty: none.",
    )
    avoid: str = _f(
        "", "What the captions must not mention, usually what the trigger word stands for (e.g. 'the person's face "
        "and hair'): the model is asked to leave it out, so the LoRA learns it from the trigger word.",
    )
    max_new_tokens: int = _f(
        0, "Longest caption in tokens (a token is about 3/4 of a word). 0 = the style's own: 64 short, 320 detailed, "
        "128 tags.", min=0, max=2048,
    )
    overwrite: bool = _f(
        False, "Caption the images that already have a caption too. Each old caption is kept beside it as "
        "name.txt.bak (name.txt.bak2, ... when that exists): nothing written by hand is lost.",
    )
    sampling_seed: int = _f(
        GREEDY, "-1: greedy decoding, the same captions on every run. 0 or more: sample with this seed (varied "
        "wording, repeatable with the same seed).", min=GREEDY, max=2**31 - 1,
    )
    image_side: int = _f(
        1024, "Images are shown to the model at most image_side x image_side pixels (their aspect kept; smaller ones as "
        "they are): fewer pixels take less GPU memory and time, and see less detail. The memory plan refuses before "
        "loading what would not fit, and names the side that would.", min=256, max=2048, step=32,
    )
    batch_size: int = _f(
        0, "Images captioned together (one generation over the batch: faster on a GPU with room to spare). 0 = as many "
        "as the memory plan's captioning phase fits in the GPU's free memory (at most 8; one at a time on a CPU, and "
        "when a seed samples, so that each image's caption depends on the seed alone).", min=0, max=16,
    )
    text_encoder_fp8: str = _f(
        "auto", "A one-byte text encoder file (fp8 scaled, int8): keep its Linears in one byte while captioning, "
        "dequantize them to bf16, or auto: keep them only where the bf16 model would not fit the GPU (the memory "
        "plan's captioning phase, plan --caption); on a CPU, dequantize.", choices=TEXT_ENCODER_FP8_MODES,
    )
    input_folder: str = _f(
        CUSTOM_FOLDER, "A subfolder of ComfyUI's input folder to caption, or '(custom path)' to use the folder typed "
        "above (as the Dataset node).", folder_list="input", extra_choices=(CUSTOM_FOLDER,),
    )

    def __post_init__(self) -> None:
        self.validate()  # settings are checked once, where they are made

    def validate(self) -> None:
        _check_range(self, "max_new_tokens", "sampling_seed", "batch_size", "image_side")
        _check_choice(self, "style")
        for name in ("trigger", "avoid"):
            if "\n" in getattr(self, name) or "\r" in getattr(self, name):
                raise UserInputError(f"{name}={getattr(self, name)!r} has a line break: write it on one line.")
        # Refused rather than stripped: the trigger is written into every caption, and a word the user cannot see
        # (ESC, NUL, a Unicode line separator pasted from elsewhere) would train a token nobody can type.
        for name, allowed in (("trigger", ""), ("avoid", ""), ("instruction", "\n\r\t")):
            found = control_character(getattr(self, name), allowed)
            if found is not None:
                position, character = found
                raise UserInputError(
                    f"{name}={getattr(self, name)[:60]!r} has the control character {character!r} (U+{ord(character):04X}) "
                    f"at position {position}: it would be written into every caption, unseen. Type the {name} again "
                    "without it (plain letters, digits, spaces and punctuation).")
