"""The family of a model set, from what its files say (models/ loads parts and knows no families).

Qwen-Image 2.1 says so in its transformer file or its diffusers folder (qwen_image21/recognise.py) and is loaded
by its own loaders; Qwen-Image-Layered says so in its transformer (`time_text_embed.addition_t_embedding`, the
flag `use_additional_t_cond`); everything else the plain Load path reads is text-to-image (qwen_image.py's
loaders, which also decide the text encoder's fp8 'auto' for the device). (Qwen-Image-Edit is
loaded by its own node, whose loader sets the variant's family.)
"""

from __future__ import annotations

from .qwen_image21.recognise import is_qwen_image21_file  # noqa: F401 (the Load node asks before resolving files)


def recognise_family(components):
    """`components`, of the family its transformer says: Layered's, else text-to-image (and a VAE of the other
    kind refused by name)."""
    from .qwen_image import text_to_image
    from .qwen_image_layered.files import recognise

    return recognise(text_to_image(components))


def load_recognised(source: str, device, storage: str = "float8", compute_dtype: str = "auto", transformer=None,
                    text_encoder=None, vae=None, tokenizer=None, diffusers_folder=None,
                    text_encoder_fp8: str = "dequantize"):
    """The model set the Load settings name, of the family its files say: what the Load node and a run file load.
    A 2.1 transformer file takes its processor from `diffusers_folder`, its text encoder and VAE from the
    `text_encoder` and `vae` files when they are given, else from that folder (`tokenizer` is Qwen-Image's and not
    read for it). `text_encoder_fp8` may be 'auto' (decided for `device`)."""
    from .qwen_image import load_model_set
    from .qwen_image21.recognise import load_from_settings

    found = load_from_settings(source, device, storage, compute_dtype, transformer, diffusers_folder, text_encoder,
                               vae, text_encoder_fp8)
    if found is not None:
        return found
    return recognise_family(load_model_set(source, device, storage=storage, compute_dtype=compute_dtype,
                                           transformer=transformer, text_encoder=text_encoder, vae=vae,
                                           tokenizer=tokenizer, diffusers_folder=diffusers_folder,
                                           text_encoder_fp8=text_encoder_fp8))
