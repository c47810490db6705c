"""Qwen-Image 2.1 Turbo: the same transformer distilled to sample in 8 steps at CFG 1 on a fixed sigma schedule, with
the same text encoder and VAE (so its files load as 2.1's, and a LoRA trained on either has the same keys).

What tells it apart is only its name: its weights have 2.1's keys and shapes. ComfyUI's Turbo template downloads
`qwen_image_2.1_turbo_int8_convrot.safetensors`, so a transformer file (or a diffusers folder) whose name holds
"turbo" is taken for Turbo, and its previews sample as that template does: euler over `TURBO_SIGMAS` (its
ManualSigmas node: comfyui-workflow-templates-json 0.1.123, `image_qwen_image_2_1_turbo_t2i.json`), CFG 1, whatever
the preview settings' steps and CFG (20 steps at CFG 4 draw noise from a distilled model).
"""

from __future__ import annotations

# The 8 sigmas a Turbo sample steps through; the terminal 0 the scheduler appends itself.
TURBO_SIGMAS = (1.0, 0.978453, 0.95418, 0.926626, 0.89508, 0.845148, 0.704534, 0.414568)
TURBO_CFG = 1.0

# The sigmas are used as they are: diffusers' flow-matching scheduler would otherwise shift them for the image's size
# (2.1's dynamic shifting) and stretch them to its shift_terminal.
TURBO_SCHEDULER = dict(use_dynamic_shifting=False, shift=1.0, shift_terminal=None)


def is_turbo(components) -> bool:
    """Whether a 2.1 model set is Turbo: its transformer file's (or folder's) name says so."""
    return "turbo" in components.name.lower()
