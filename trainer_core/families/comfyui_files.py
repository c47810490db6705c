"""The Qwen-Image model files users have: every one ComfyUI's own templates download (package
`comfyui-workflow-templates-json` 0.1.123, `templates/*.json`: the loader nodes' file names and their
`properties.models` download addresses), plus the other formats of the same models Comfy-Org publishes.

`tests/families/test_comfyui_files.py` reads the templates package itself: a Qwen-Image file a new template names and this
table does not know fails it, so the table follows ComfyUI. Pure data (no torch): the workflow builder, the Load
nodes' help and the planner's advice read it.
"""

from __future__ import annotations

from dataclasses import dataclass

# The family names of families/ (registered there; repeated here as plain strings to keep this module import-free).
QWEN_IMAGE, EDIT, LAYERED, QWEN_IMAGE21 = "qwen-image", "qwen-image-edit", "qwen-image-layered", "qwen-image-2.1"


@dataclass(frozen=True)
class ModelFile:
    name: str  # the file name in ComfyUI's models folder
    folder: str  # ComfyUI's models folder: diffusion_models, text_encoders or vae
    family: str  # the family that trains on it (families/)
    member: str  # which model: "Qwen-Image", "Qwen-Image-2512", "Qwen-Image-Edit-2511", "Qwen-Image 2.1 Turbo", ...
    storage: str  # how its weights are stored: bf16, fp8 (float8_e4m3fn), fp8 scaled, fp8 mixed, int8 ConvRot, w4a8
    url: str = ""  # the download address ComfyUI's templates give it (`properties.models`); "" where none names it

    @property
    def readable(self) -> bool:
        """Whether the pack reads the file (w4a8 is a 4-bit format: models/layouts.py refuses it by name)."""
        return self.storage != "w4a8"


_HF = "https://huggingface.co/Comfy-Org"
_QI = f"{_HF}/Qwen-Image_ComfyUI/resolve/main/split_files"
_QE = f"{_HF}/Qwen-Image-Edit_ComfyUI/resolve/main/split_files"
_QL = f"{_HF}/Qwen-Image-Layered_ComfyUI/resolve/main/split_files"
_Q21 = f"{_HF}/Qwen-Image-2.1/resolve/main"

MODEL_FILES = (
    # Qwen-Image (and 2512, the same architecture and text encoder)
    ModelFile("qwen_image_fp8_e4m3fn.safetensors", "diffusion_models", QWEN_IMAGE, "Qwen-Image", "fp8",
              f"{_QI}/diffusion_models/qwen_image_fp8_e4m3fn.safetensors"),
    ModelFile("qwen_image_bf16.safetensors", "diffusion_models", QWEN_IMAGE, "Qwen-Image", "bf16"),
    ModelFile("qwen_image_2512_fp8_e4m3fn.safetensors", "diffusion_models", QWEN_IMAGE, "Qwen-Image-2512", "fp8",
              f"{_QI}/diffusion_models/qwen_image_2512_fp8_e4m3fn.safetensors"),
    ModelFile("qwen_2.5_vl_7b_fp8_scaled.safetensors", "text_encoders", QWEN_IMAGE, "Qwen2.5-VL-7B (Qwen-Image 1.x)",
              "fp8 scaled", f"{_QI}/text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors"),
    ModelFile("qwen_2.5_vl_7b.safetensors", "text_encoders", QWEN_IMAGE, "Qwen2.5-VL-7B (Qwen-Image 1.x)", "bf16"),
    ModelFile("qwen_image_vae.safetensors", "vae", QWEN_IMAGE, "Qwen-Image VAE (1.x)", "bf16",
              f"{_QI}/vae/qwen_image_vae.safetensors"),
    # Qwen-Image-Edit, 2509, 2511 (their text encoder and VAE are Qwen-Image's)
    ModelFile("qwen_image_edit_fp8_e4m3fn.safetensors", "diffusion_models", EDIT, "Qwen-Image-Edit", "fp8",
              f"{_QE}/diffusion_models/qwen_image_edit_fp8_e4m3fn.safetensors"),
    ModelFile("qwen_image_edit_2509_fp8_e4m3fn.safetensors", "diffusion_models", EDIT, "Qwen-Image-Edit-2509", "fp8",
              f"{_QE}/diffusion_models/qwen_image_edit_2509_fp8_e4m3fn.safetensors"),
    ModelFile("qwen_image_edit_2509_int8_convrot.safetensors", "diffusion_models", EDIT, "Qwen-Image-Edit-2509",
              "int8 ConvRot", f"{_HF}/marigold-v2-0/resolve/main/diffusion_models/qwen_image_edit_2509_int8_convrot.safetensors"),
    ModelFile("qwen_image_edit_2511_bf16.safetensors", "diffusion_models", EDIT, "Qwen-Image-Edit-2511", "bf16",
              f"{_QE}/diffusion_models/qwen_image_edit_2511_bf16.safetensors"),
    ModelFile("qwen_image_edit_2511_fp8mixed.safetensors", "diffusion_models", EDIT, "Qwen-Image-Edit-2511",
              "fp8 mixed", f"{_QE}/diffusion_models/qwen_image_edit_2511_fp8mixed.safetensors"),
    ModelFile("qwen_image_edit_2511_int8_convrot.safetensors", "diffusion_models", EDIT, "Qwen-Image-Edit-2511",
              "int8 ConvRot", f"{_QE}/diffusion_models/qwen_image_edit_2511_int8_convrot.safetensors"),
    # Qwen-Image-Layered (Qwen-Image's text encoder, its own RGBA VAE)
    ModelFile("qwen_image_layered_bf16.safetensors", "diffusion_models", LAYERED, "Qwen-Image-Layered", "bf16",
              f"{_QL}/diffusion_models/qwen_image_layered_bf16.safetensors"),
    ModelFile("qwen_image_layered_vae.safetensors", "vae", LAYERED, "Qwen-Image-Layered VAE", "bf16",
              f"{_QL}/vae/qwen_image_layered_vae.safetensors"),
    # Qwen-Image 2.1 and its Turbo (the same architecture, text encoder and VAE)
    ModelFile("qwen_image_2.1_int8_convrot.safetensors", "diffusion_models", QWEN_IMAGE21, "Qwen-Image 2.1",
              "int8 ConvRot", f"{_Q21}/diffusion_models/qwen_image_2.1_int8_convrot.safetensors"),
    ModelFile("qwen_image_2.1_turbo_int8_convrot.safetensors", "diffusion_models", QWEN_IMAGE21,
              "Qwen-Image 2.1 Turbo", "int8 ConvRot", f"{_Q21}/diffusion_models/qwen_image_2.1_turbo_int8_convrot.safetensors"),
    ModelFile("qwen_image_2.1_bf16.safetensors", "diffusion_models", QWEN_IMAGE21, "Qwen-Image 2.1", "bf16"),
    ModelFile("qwen3vl_8b_int8_convrot.safetensors", "text_encoders", QWEN_IMAGE21, "Qwen3-VL-8B (Qwen-Image 2.1)",
              "int8 ConvRot", f"{_Q21}/text_encoders/qwen3vl_8b_int8_convrot.safetensors"),
    ModelFile("qwen3vl_8b_bf16.safetensors", "text_encoders", QWEN_IMAGE21, "Qwen3-VL-8B (Qwen-Image 2.1)", "bf16"),
    ModelFile("qwen3vl_8b_w4a8.safetensors", "text_encoders", QWEN_IMAGE21, "Qwen3-VL-8B (Qwen-Image 2.1)", "w4a8"),
    ModelFile("qwen_image_2.1_vae_bf16.safetensors", "vae", QWEN_IMAGE21, "Qwen-Image 2.1 VAE (RGBA)", "bf16",
              f"{_Q21}/vae/qwen_image_2.1_vae_bf16.safetensors"),
)

# Files ComfyUI's Qwen-Image templates load that are no part of a model trained here, and why.
NOT_MODEL_PARTS = {
    "qwen3.5_9b_qwen_image_2.1_pe_t2i.int8_convrot.safetensors":
        "a Qwen3.5-9B prompt rewriter for ComfyUI's TextGenerate node (the 2.1 templates' prompt enhancer)",
    "qwen3.5_9b_qwen_image_2.1_pe_i2i.int8_convrot.safetensors":
        "a Qwen3.5-9B prompt rewriter for ComfyUI's TextGenerate node (the 2.1 edit templates' prompt enhancer)",
    "qwen_image_layered_control_bf16.safetensors":
        "DiffSynth-Studio's Layered-Control, a Layered transformer with control inputs this pack does not train",
}

BY_NAME = {f.name: f for f in MODEL_FILES}


def known_file(name: str) -> ModelFile | None:
    """The table's entry for a file name (any folder part of `name` ignored), or None."""
    return BY_NAME.get(str(name).replace("\\", "/").rsplit("/", 1)[-1])


def files_of(family: str, folder: str | None = None) -> list[ModelFile]:
    """The readable files of `family` (in `folder` when given), in the table's order."""
    return [f for f in MODEL_FILES if f.family == family and f.readable and (folder is None or f.folder == folder)]
