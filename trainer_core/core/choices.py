"""The allowed values of settings with a home of their own (the settings in config.py, and the engine's
modules that act on them, name them from here or from config.py, which re-exports them)."""

# Allowed values with one home each; the engine modules that act on them import them from here.
STORAGE_MODES = ("float8", "float8_scaled", "bfloat16", "float32")  # block Linear weights (models.float8)
TEXT_ENCODER_FP8_MODES = ("auto", "dequantize", "keep")  # an fp8-scaled text encoder file (models.text_encoder_file)
LORA_LAYOUTS = ("comfyui", "diffusers", "kohya")  # LoRA file key layouts (lora_files)
ADAPTER_TYPES = ("lora", "lokr", "loha")  # the adapter kinds (adapters.lora, adapters.lycoris)
SAVE_DTYPES = ("bfloat16", "float16", "float32")  # precision of a saved LoRA file (torch dtype names)
COMPUTE_DTYPES = ("auto", "bfloat16", "float32")
# A model file choice for workflows that load no files (the tiny model, a diffusers folder): always listed,
# so such a workflow validates in a ComfyUI without the Qwen-Image files.
NOT_USED = "(not used)"
# The last is the small pretrained model that ships with the pack (models/pretrained.py): it draws coloured shapes,
# so a first run shows what a LoRA taught it. Appended: a saved workflow stores the chosen name, not its position.
MODEL_SOURCES = ("ComfyUI model files", "diffusers folder", "tiny test model (random weights)",
                 "shapes model (small, pretrained, ships with the pack)")
NO_LORA = "(none: start from zero)"  # the continue_from_lora choice that starts a new adapter
CUSTOM_FOLDER = "(custom path)"  # the dataset input_folder choice that uses the typed folder path
# What a dataset does with transparent images (DatasetConfig.transparency): keep them as RGBA (a family whose VAE
# encodes alpha: ModelFamily.keeps_transparency), composite them onto the background, or keep where the model can.
TRANSPARENCY_CHOICES = ("auto", "keep", "flatten")
# The memory planner models these block storages (float32 blocks are a CPU/test mode it does not cover), and "int8": an
# int8 ConvRot file's weights kept as they are (what a float8 mode does with ComfyUI's int8 files, models/float8/).
PLAN_STORAGE_MODES = (*(m for m in STORAGE_MODES if m != "float32"), "int8")
# The text encoder files the planner knows: bf16, ComfyUI's fp8 scaled (Qwen-Image's template file) or int8 ConvRot
# (2.1's template file); a one-byte file may keep its Linears in one byte while caching.
PLAN_TEXT_ENCODER_FILES = ("bf16", "fp8", "int8")


# The LoRA target presets by name (what each holds is an architecture fact: models/qwen_arch.LORA_TARGET_PRESETS,
# which test_layout checks against these names). Named here so the settings import no model code.
LORA_TARGET_PRESET_NAMES = ("attention", "attention+mlp", "all")

# The Load Edit node's edit_variant: "auto" (read from the file) or one of Qwen-Image-Edit's variants, which are its
# families' names (families/qwen_image_edit/variants.py defines them; a test checks the two agree).
EDIT_VARIANT_CHOICES = ("auto", "edit", "edit-2509", "edit-2511")

# How `export-tiny` writes a tiny model: ComfyUI's single files (models/part_files.py) or a diffusers folder.
EXPORT_LAYOUTS = ("comfyui", "diffusers")

# The Caption Dataset node's and `caption` command's styles: a one-line subject caption, a detailed description,
# comma-separated tags (each style's instruction: trainer_core/captions/prompts.py).
CAPTION_STYLES = ("short", "detailed", "tags", "edit")
