"""The family of a loaded model set, from what its files say (models/ loads parts and knows no families).

Qwen-Image-Layered says so in its transformer (`time_text_embed.addition_t_embedding`, the flag
`use_additional_t_cond`); everything else the plain Load path reads is text-to-image. (Qwen-Image-Edit is
loaded by its own node, whose loader sets the variant's family.)
"""

from __future__ import annotations


def recognise_family(components):
    """`components`, its family set from its transformer (and a VAE of the other kind refused by name)."""
    from .qwen_image_layered.files import recognise

    return recognise(components)
