"""Working memory of the forwards without gradients around training: a preview's denoising step, the VAE's
encode (caching) and decode (previews), the text encoder's forward (caching).

Measured, not derived: `tools/calibrate_preview.py` prints every constant here (peaks of live bytes above
the inputs, `memprobe.LiveBytes`, bf16, on the CPU). The sizes of the parts come from `PartSizes`: the
real Qwen-Image's (`real_parts`), or a loaded model set's (`parts_for_components`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass

from .arch import QwenImageArch, text_encoder_params, vae_params
from .plan import DTYPE_BYTES

# One transformer block's forward without gradients (eval mode, LoRA on), bytes per joint token (image +
# text) per unit of MLP width F; key (targets preset, LoRA dtype). Width-independent (2 and 4 heads agree
# exactly); measured at 64 x 64 image + 256 text tokens. A text-heavy input (16 x 16 + 512) measures less
# per joint token, so the table is on the safe side there. fp32 LoRA weights cost more: peft casts each
# adapted Linear's input to fp32.
PREVIEW_WORKING_PER_TOKEN = {
    ('attention', 'float32'): 7.795,
    ('attention', 'bfloat16'): 6.707,
    ('attention+mlp', 'float32'): 13.295,
    ('attention+mlp', 'bfloat16'): 8.59,
    ('all', 'float32'): 13.295,
    ('all', 'bfloat16'): 8.59,
}
# The Qwen-Image VAE (Wan 2.1 layout) on one frame, bf16: the peak is linear in the pixels of the image and
# proportional to the VAE's base channel width (96 in the real VAE: 1929 B/px encoding, 3460 B/px decoding,
# so 1.88 and 3.38 GiB at 1024 x 1024). The larger of the figures at base_dim 96 and 48.
VAE_ENCODE_BYTES_PER_PIXEL_CHANNEL = 20.22
VAE_DECODE_BYTES_PER_PIXEL_CHANNEL = 36.12
# The text encoder's forward keeps every hidden state (the pipeline reads the last one); per token it holds
# 3 x layers x hidden bytes (hidden states kept + the residual stream, bf16) + 3 x intermediate x 2 (the
# MLP's gate, up and product) + this remainder, which does not grow with the width (RoPE tables, masks).
TEXT_ENCODER_EXTRA_PER_TOKEN = 2576
# Tokens the chat template adds around a prompt (34 before with the real tokenizer, 5 after), rounded up.
TEMPLATE_TOKENS = 40


@dataclass(frozen=True)
class PartSizes:
    """The parts besides the transformer: what the phases of caching and previews hold."""

    text_encoder_params: int  # as loaded: Qwen-Image's language model only (no vision tower, no lm_head); 2.1's whole
    text_encoder_linear_params: int  # its decoder Linears: float8 in the fp8_scaled file
    text_encoder_largest: int  # parameters of its largest tensor (the token embeddings)
    text_hidden: int
    text_layers: int
    text_intermediate: int
    vae_params: int
    vae_base_dim: int
    # Its attention's keys and values per token and layer (a generation's KV cache: captioning.py), Qwen2.5-VL-7B's
    # by default (4 KV heads of 128).
    text_kv_heads: int = 4
    text_head_dim: int = 128
    # The model's own measured constants (Qwen-Image's by default; another family's in its `planned_parts`).
    vae_encode_per_pixel_channel: float = VAE_ENCODE_BYTES_PER_PIXEL_CHANNEL
    vae_decode_per_pixel_channel: float = VAE_DECODE_BYTES_PER_PIXEL_CHANNEL
    text_extra_per_token: int = TEXT_ENCODER_EXTRA_PER_TOKEN
    text_logits_per_token: int = 0  # vocabulary entries of logits the forward computes (Qwen-Image's loader drops lm_head)
    # The vision tower that encodes reference / control images with the prompt (planner/references.py), as loaded:
    # 0 layers when there is none (Qwen-Image's text-to-image loader drops it; Edit's and 2.1's keep it).
    vision_params: int = 0
    vision_layers: int = 0
    vision_hidden: int = 0  # V: width of its blocks
    vision_out: int = 0  # width of its merged tokens (the text encoder's hidden size)
    vision_patch: int = 16  # px per patch side
    vision_merge: int = 2  # patches merged per side into one vision token
    vision_temporal_patch: int = 2  # frames per patch (an image is repeated to fill them)
    vision_deepstack: tuple[int, ...] = ()  # blocks whose outputs are merged again (DeepStack features)
    vision_working_per_patch_channel: float = 0.0  # one block's transients (references.py), 2.1's or Edit's
    vision_block_linear_params: int = 0  # one vision block's Linear weights: what streaming one block moves
    # Its processor's pixel bounds (`smart_resize`): Qwen2.5-VL-7B's preprocessor_config.json (3136, 12845056) by
    # default, Qwen3-VL's in 2.1's parts (65536, 16777216). What the captioning plan sizes an image with.
    vision_min_pixels: int = 3136
    vision_max_pixels: int = 12845056
    vae_image_channels: int = 3  # channels of a decoded image: RGB, or RGBA (Layered's and 2.1's VAEs)
    # The text encoder file that keeps its Linears in one byte (what the plan suggests when caching does not fit), and
    # its kind among the files the planner knows (PLAN_TEXT_ENCODER_FILES: the `plan --text-encoder-file` default).
    one_byte_text_encoder_file: str = "qwen_2.5_vl_7b_fp8_scaled"
    one_byte_text_encoder_format: str = "fp8"

    @property
    def text_layer_linear_params(self) -> int:
        """One decoder layer's Linear weights (every layer alike): what streaming one layer moves."""
        return self.text_encoder_linear_params // max(self.text_layers, 1)


@functools.lru_cache(maxsize=1)
def real_parts() -> PartSizes:
    """Qwen2.5-VL-7B and the Qwen-Image VAE as loaded (counted on the meta device)."""
    from diffusers import AutoencoderKLQwenImage

    from ..models.qwen_arch import QWEN25_VL_7B_CONFIG

    text = QWEN25_VL_7B_CONFIG["text_config"]
    total, linears = text_encoder_params()
    base_dim = inspect.signature(AutoencoderKLQwenImage.__init__).parameters["base_dim"].default
    return PartSizes(
        text_encoder_params=total, text_encoder_linear_params=linears,
        text_encoder_largest=text["vocab_size"] * text["hidden_size"], text_hidden=text["hidden_size"],
        text_layers=text["num_hidden_layers"], text_intermediate=text["intermediate_size"],
        text_kv_heads=text["num_key_value_heads"], text_head_dim=text["hidden_size"] // text["num_attention_heads"],
        vae_params=vae_params(), vae_base_dim=base_dim)


def vision_fields(encoder) -> dict:
    """PartSizes' vision fields of a Qwen3-VL (2.1) or Qwen2.5-VL (Edit) text encoder, meta or loaded: its
    `model.visual` and its config (Qwen2.5-VL has no DeepStack)."""
    from .references import QWEN25_VISION_BLOCK_WORKING_PER_PATCH_CHANNEL, VISION_BLOCK_WORKING_PER_PATCH_CHANNEL

    from torch import nn

    visual, cfg = encoder.model.visual, encoder.config.vision_config
    deepstack = getattr(cfg, "deepstack_visual_indexes", None)
    block = sum(m.weight.numel() for m in visual.blocks[0].modules() if isinstance(m, nn.Linear))
    return dict(vision_params=sum(p.numel() for p in visual.parameters()), vision_layers=cfg.depth,
                vision_block_linear_params=block,
                vision_hidden=cfg.hidden_size, vision_out=cfg.out_hidden_size, vision_patch=cfg.patch_size,
                vision_merge=cfg.spatial_merge_size, vision_temporal_patch=cfg.temporal_patch_size,
                vision_deepstack=tuple(deepstack or ()),
                vision_working_per_patch_channel=VISION_BLOCK_WORKING_PER_PATCH_CHANNEL if deepstack is not None
                else QWEN25_VISION_BLOCK_WORKING_PER_PATCH_CHANNEL)


def vae_image_channels(vae) -> int:
    """The channels a VAE decodes: `out_channels` (2.1's VAE) or `input_channels` (Qwen-Image's, Layered's 4)."""
    config = vae.config
    return config["out_channels"] if "out_channels" in config else config.get("input_channels", 3)


def parts_for_components(components) -> PartSizes:
    """The sizes of a loaded model set's VAE (and text encoder, while it is loaded); its family's real model's for a
    part that is not there (a released text encoder: caching is over by the time a run is planned)."""
    fields: dict = {}
    vae = components.vae
    if vae is not None:
        fields.update(vae_params=sum(p.numel() for p in vae.parameters()), vae_base_dim=vae.config.base_dim,
                      vae_image_channels=vae_image_channels(vae))
    if components.text_encoder is not None:
        fields.update(encoder_fields(components.text_encoder))
    # The real model's constants and the sizes of a part not loaded (its encoder as a folder loads it, head and all).
    return dataclasses.replace(components.family.planned_parts(text_encoder_file=False), **fields)


def encoder_fields(encoder) -> dict:
    """PartSizes' text encoder (and vision tower) fields of a Qwen2.5-VL or Qwen3-VL encoder, loaded or on the meta
    device (only shapes are read)."""
    from torch import nn

    text = encoder.config.get_text_config() if hasattr(encoder.config, "get_text_config") else encoder.config
    params = dict(encoder.named_parameters())
    linears = sum(m.weight.numel() for n, m in encoder.named_modules() if isinstance(m, nn.Linear) and ".layers." in f".{n}")
    fields = dict(
        text_encoder_params=sum(p.numel() for p in params.values()), text_encoder_linear_params=linears,
        text_encoder_largest=max(p.numel() for p in params.values()), text_hidden=text.hidden_size,
        text_layers=text.num_hidden_layers, text_intermediate=text.intermediate_size,
        text_kv_heads=text.num_key_value_heads,
        text_head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
        # logits the forward computes: 2.1's folder encoder keeps its lm_head; the file loaders drop it
        text_logits_per_token=head.out_features if isinstance(head := getattr(encoder, "lm_head", None), nn.Linear) else 0)
    if getattr(getattr(encoder, "model", None), "visual", None) is not None:
        fields.update(vision_fields(encoder))  # 2.1's or Edit's tower (its weights are in the params above)
    return fields


def parts_for_encoder(encoder, base: PartSizes) -> PartSizes:
    """The sizes the caching phase plans for `encoder` (loaded or on the meta device): `base`'s measured constants (its
    family's real parts: `ModelFamily.planned_parts`) with the encoder's own shapes."""
    return dataclasses.replace(base, **encoder_fields(encoder))


def preview_block_working_bytes(arch: QwenImageArch, targets: str, lora_dtype: str, n_img: int, n_txt: int) -> int:
    """One block's forward transients in a denoising step (batch 1: true CFG runs its two forwards in turn)."""
    if arch.single_stream:  # measured for a single-stream block
        from . import single_stream

        return single_stream.preview_block_working_bytes(arch, targets, lora_dtype, n_img, n_txt)
    return int(PREVIEW_WORKING_PER_TOKEN[(targets, lora_dtype)] * arch.mlp_dim * (n_img + n_txt))


def vae_element_bytes(p) -> int:
    """The bytes per element the VAE computes in, for PlanInputs `p`: on the CPU a bf16/fp16 VAE computes in float32
    (`models.latents`: the CPU has no fast half-precision 3-D convolution)."""
    act = DTYPE_BYTES[p.compute_dtype]
    return 4 if p.device == "cpu" and act < 4 else act


def vae_encode_bytes(parts: PartSizes, width: int, height: int, element_bytes: int = 2) -> int:
    """The encode's peak above its input; the per-pixel figure is bf16's, and every live tensor has the VAE's dtype."""
    return int(parts.vae_encode_per_pixel_channel * parts.vae_base_dim * width * height * element_bytes / 2)


# diffusers' tiled VAE decode (`AutoencoderKLQwenImage` and `AutoencoderKLQwenImage21`: `enable_tiling`'s defaults):
# tiles of 256 x 256 px every 192 px, each decoded alone, then blended into the image.
VAE_TILE, VAE_TILE_STRIDE = 256, 192


def vae_tiled_decode_bytes(parts: PartSizes, width: int, height: int, element_bytes: int = 2, tile: int = VAE_TILE,
                           stride: int = VAE_TILE_STRIDE) -> int:
    """The tiled decode's peak: one tile's decode, every decoded tile kept until the blend, the blended rows and the
    image (`vae_image_channels` each). Measured against `LiveBytes` on the real VAE's structure: 1-7% over the peak
    (tests/planner/test_previews_fit.py)."""
    if width <= tile and height <= tile:
        return vae_decode_bytes(parts, width, height, element_bytes)
    one = vae_decode_bytes(parts, min(width, tile), min(height, tile), element_bytes)
    tiles = -(-height // stride) * -(-width // stride) * tile * tile
    return one + (tiles + 2 * width * height) * parts.vae_image_channels * element_bytes


def vae_decode_bytes(parts: PartSizes, width: int, height: int, element_bytes: int = 2) -> int:
    return int(parts.vae_decode_per_pixel_channel * parts.vae_base_dim * width * height * element_bytes / 2)


# The decode on a GPU holds more than its tensors: the first device check (H100, torch 2.11.0+cu130, 2026-12-06)
# measured the preview phase 0.89-0.94 GiB of allocated memory above the plan at 1024 x 1024 in all three settings,
# where this decode (3.39 GiB planned from the tensors the CPU measures) is the larger working term: cuDNN's
# convolution workspaces, which live tensors do not show. One size measured, so taken as proportional to the decode.
CUDA_DECODE_FACTOR = 1.28


def device_decode_bytes(decode_bytes: int, device_type: str) -> int:
    """A decode's bytes (`vae_decode_bytes` or `vae_tiled_decode_bytes`) on `device_type`'s allocator."""
    return int(decode_bytes * CUDA_DECODE_FACTOR) if device_type == "cuda" else decode_bytes


def text_encoder_working_bytes(parts: PartSizes, prompt_tokens: int, act_bytes: int = 2) -> int:
    """The text encoder's forward on one prompt of `prompt_tokens` tokens (the chat template added here)."""
    tokens = prompt_tokens + TEMPLATE_TOKENS
    per_token = (3 * parts.text_layers * parts.text_hidden + 3 * parts.text_intermediate * act_bytes
                 + parts.text_logits_per_token * act_bytes + parts.text_extra_per_token)
    return tokens * per_token
