"""The architecture facts in `models.qwen_arch` against the classes they describe (diffusers' transformer).

The names are typed out once, there; these checks make a diffusers release that renames or adds a
module fail here, instead of a preset silently adapting fewer layers or a kohya key no longer mapping.
"""

import inspect

from torch import nn

from trainer_core.models import qwen_arch
from trainer_core.models.qwen_arch import (
    AXES_DIMS_ROPE, BLOCK_LINEARS, BLOCKS, DEAD_IN_LAST_BLOCK, IMG_STREAM, LORA_TARGET_PRESETS, OUTER_LINEARS,
    PATCH_SIZE, TXT_STREAM, block_module, split_block_module,
)


def _tiny_transformer():
    from diffusers import QwenImageTransformer2DModel

    from trainer_core.models.tiny import TINY_TRANSFORMER

    return QwenImageTransformer2DModel(**TINY_TRANSFORMER)


def test_module_names_are_the_transformers_linears():
    model = _tiny_transformer()
    blocks = getattr(model, BLOCKS)
    for block in blocks:
        assert {n for n, m in block.named_modules() if isinstance(m, nn.Linear)} == set(BLOCK_LINEARS)
    outer = {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and not n.startswith(BLOCKS)}
    assert outer == set(OUTER_LINEARS)
    assert len(BLOCK_LINEARS) == len(set(BLOCK_LINEARS)) == 14
    assert set(IMG_STREAM.values()) | set(TXT_STREAM.values()) == set(BLOCK_LINEARS)
    assert not set(IMG_STREAM.values()) & set(TXT_STREAM.values())


def test_presets_and_dead_modules_are_block_linears():
    assert LORA_TARGET_PRESETS["all"] == BLOCK_LINEARS
    for modules in LORA_TARGET_PRESETS.values():
        assert set(modules) <= set(BLOCK_LINEARS)
    # Only text-stream modules can be dead in the last block (the image stream feeds proj_out).
    assert set(DEAD_IN_LAST_BLOCK) <= set(TXT_STREAM.values())


def test_real_model_constants_are_diffusers_defaults():
    from diffusers import QwenImageTransformer2DModel

    defaults = inspect.signature(QwenImageTransformer2DModel.__init__).parameters
    assert PATCH_SIZE == defaults["patch_size"].default
    assert tuple(AXES_DIMS_ROPE) == tuple(defaults["axes_dims_rope"].default)
    assert sum(AXES_DIMS_ROPE) == defaults["attention_head_dim"].default


def test_block_module_names_round_trip():
    assert block_module(3, "attn.to_q") == "transformer_blocks.3.attn.to_q"
    assert split_block_module("transformer_blocks.12.img_mlp.net.0.proj") == (12, "img_mlp.net.0.proj")


def test_the_facts_module_imports_nothing():
    """Pure data: the config (and so every node) imports it; it must not pull in torch or diffusers. It declares the
    MMDiT's architecture (models/architecture.py, pure data as well) for the layers that ask of one."""
    import ast

    from trainer_core.models import architecture

    for module, allowed in ((qwen_arch, ["from .architecture import TransformerArchitecture, declare_architecture"]),
                            (architecture, ["from collections.abc import Mapping",
                                            "from dataclasses import dataclass, field"])):
        tree = ast.parse(inspect.getsource(module))
        imported = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert [ast.unparse(n) for n in imported] == ["from __future__ import annotations", *allowed]


def test_the_mmdit_is_declared_with_its_facts_and_its_vaes_scale():
    """The architecture the lower layers ask of a QwenImageTransformer2DModel: its presets, the last block's dead
    Linears, its MLP input, and the VAE scale diffusers' AutoencoderKLQwenImage defaults give (2 ** downsamplings)."""
    from diffusers import AutoencoderKLQwenImage

    from trainer_core.models.architecture import architecture_of

    mmdit = architecture_of(_tiny_transformer())
    assert mmdit is qwen_arch.MMDIT and mmdit.lora_presets == LORA_TARGET_PRESETS
    assert mmdit.dead_in_last_block == DEAD_IN_LAST_BLOCK and mmdit.mlp_input_linear == IMG_STREAM["mlp0"]
    downsampling = inspect.signature(AutoencoderKLQwenImage.__init__).parameters["temperal_downsample"].default
    assert mmdit.vae_scale_factor == 2 ** len(downsampling)


def test_latent_statistics_are_the_vaes_defaults():
    from diffusers import AutoencoderKLQwenImage

    from trainer_core.models.qwen_arch import LATENTS_MEAN, LATENTS_STD

    defaults = inspect.signature(AutoencoderKLQwenImage.__init__).parameters
    assert list(LATENTS_MEAN) == list(defaults["latents_mean"].default)
    assert list(LATENTS_STD) == list(defaults["latents_std"].default)
    assert len(LATENTS_MEAN) == defaults["z_dim"].default
