"""Loading Qwen-Image for training."""

from __future__ import annotations

from ..trainer_core.core.config import NOT_USED, LoadConfig
from ..trainer_core.families.recognise import is_qwen_image21_file, load_recognised
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
        settings = dict(storage=storage, compute_dtype=compute_dtype, text_encoder_fp8=text_encoder_fp8)
        with engine_mode():
            if source != FILES:  # the tiny model, or a diffusers folder (a path typed in the node)
                return (load_recognised(source, host.compute_device(), diffusers_folder=diffusers_folder, **settings),)
            first = host.model_file_path("diffusion_models", transformer)
            if is_qwen_image21_file(first):  # its processor (and a part set to (not used)) from diffusers_folder
                encoder = None if text_encoder == NOT_USED else host.model_file_path("text_encoders", text_encoder)
                vae_file = None if vae == NOT_USED else host.model_file_path("vae", vae)
                return (load_recognised(source, host.compute_device(), transformer=first, text_encoder=encoder,
                                        vae=vae_file, diffusers_folder=diffusers_folder, **settings),)
            paths = [first] + [host.model_file_path(kind, name) for kind, name in
                               (("text_encoders", text_encoder), ("vae", vae))]
            # A tokenizer folder beside the files wins; otherwise the Qwen2.5 tokenizer ComfyUI ships.
            beside = any(c.is_dir() for c in tokenizer_candidates(None, paths[1]))
            tokenizer = None if beside else host.bundled_qwen_tokenizer()
            return (load_recognised(source, host.compute_device(), transformer=paths[0], text_encoder=paths[1],
                                    vae=paths[2], tokenizer=tokenizer, diffusers_folder=diffusers_folder, **settings),)
