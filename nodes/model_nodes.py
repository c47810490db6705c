"""Loading Qwen-Image for training."""

from __future__ import annotations

from ..trainer_core.core.config import NOT_USED, LoadConfig
from ..trainer_core.families.loading import LoadRequest, load_model_set
from ..trainer_core.models.source import FILES
from ..trainer_core.models.tokenizer import tokenizer_candidates
from . import host
from .common import CATEGORY, MODELS, engine_mode
from .widgets import widgets


class QwenLoRALoadModels:
    DESCRIPTION = (
        "Loads Qwen-Image for LoRA training from the files ComfyUI already uses (diffusion_models, "
        "text_encoders, vae; bf16, fp8, fp8-scaled, fp8mixed or int8 ConvRot: the files ComfyUI's own templates "
        "download), or from a diffusers folder. The model is recognised from the transformer: Qwen-Image (and 2512), "
        "Qwen-Image-Layered, or Qwen-Image 2.1 and its Turbo (whose processor, and any part set to (not used), come "
        "from the diffusers 2.1 folder named in diffusers_folder). The transformer's block weights are kept in one "
        "byte (float8, or an int8 file's int8). The output feeds the Cache and Init Trainer nodes."
    )
    CATEGORY = CATEGORY
    FUNCTION = "load"
    RETURN_TYPES = (MODELS,)
    RETURN_NAMES = ("models",)
    OUTPUT_TOOLTIPS = ("Qwen-Image parts for training (not a ComfyUI MODEL).",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": widgets(LoadConfig)}

    def load(self, source, transformer, text_encoder, vae, diffusers_folder, storage, compute_dtype,
             text_encoder_fp8):
        with engine_mode():
            return (load_model_set(load_request(source, transformer, text_encoder, vae, diffusers_folder, storage,
                                                compute_dtype, text_encoder_fp8)),)


def load_request(source, transformer, text_encoder, vae, diffusers_folder, storage, compute_dtype, text_encoder_fp8,
                 **edit) -> LoadRequest:
    """The Load settings as the engine's request (the family whose files they are loads them): model files found in
    ComfyUI's model folders (a part set to (not used) is none: a family may read it from its diffusers folder), and a
    tokenizer folder beside the text encoder, else the Qwen2.5 tokenizer ComfyUI ships. `edit`: the Load Edit node's
    (edit=True, edit_variant)."""
    files = {}
    if source == FILES:
        def found(kind, name):
            return None if name == NOT_USED else host.model_file_path(kind, name)

        files = dict(transformer=host.model_file_path("diffusion_models", transformer),
                     text_encoder=found("text_encoders", text_encoder), vae=found("vae", vae))
        beside = files["text_encoder"] is not None and any(
            c.is_dir() for c in tokenizer_candidates(None, files["text_encoder"]))
        files["tokenizer"] = None if beside else host.bundled_qwen_tokenizer()
    return LoadRequest(source, host.compute_device(), storage=storage, compute_dtype=compute_dtype,
                       diffusers_folder=diffusers_folder, text_encoder_fp8=text_encoder_fp8, **files, **edit)
