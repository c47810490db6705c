"""Single model files in ComfyUI's layouts: every layout loads to the exact (or exactly quantised) weights,
the real models' configs are recognised from their shapes, and wrong files are refused by name."""

import copy

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import cached_demo
from trainer_core.models.part_files import public_config, write_part_file
from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image import build_tiny_components, load_single_files
from trainer_core.models.float8 import FLOAT8, dequantized_state_dict, frozen_block_linears
from trainer_core.models.latents import decode_latents, encode_images
from trainer_core.models.qwen_arch import QWEN25_VL_7B_CONFIG
from trainer_core.models.text import encode_prompts
from trainer_core.models.text_encoder_file import (
    comfyui_name, empty_text_encoder, load_text_encoder_file, our_name, text_encoder_config,
    text_encoder_file_tensors,
)
from trainer_core.models.transformer_file import load_transformer_file, transformer_config, transformer_file_tensors
from trainer_core.models.vae_file import diffusers_to_wan_name, load_vae_file, vae_config_from_shapes, vae_file_tensors

PREFIXES = ["", "model.diffusion_model.", "model.", "diffusion_model.", "transformer."]
PROMPTS = ["a red circle", "a green square on a white stripe pattern"]


@pytest.fixture(scope="module")
def bf16_parts():
    """Tiny parts held in bf16, so a bf16 file stores them exactly."""
    return build_tiny_components(seed=0, storage="bfloat16", compute_dtype=torch.bfloat16)


def assert_same_parameters(original, loaded, names=None):
    a, b = dict(original.named_parameters()), dict(loaded.named_parameters())
    names = names if names is not None else a.keys()
    assert set(names) == set(b), set(names) ^ set(b)
    for name in names:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


def write_transformer(parts, tmp_path, fmt, prefix=""):
    return write_part_file(transformer_file_tensors(parts.transformer, fmt, prefix), tmp_path / "t.safetensors",
                           "transformer", fmt, public_config(parts.transformer.config))


# ----------------------------------------------------------------------------------------------------
# transformer


@pytest.mark.parametrize("prefix", PREFIXES)
def test_bf16_transformer_file_loads_exactly_under_every_prefix(bf16_parts, tmp_path, prefix):
    path = write_transformer(bf16_parts, tmp_path, "bf16", prefix)
    assert all(k.startswith(prefix) for k in load_file(str(path)))
    loaded = load_transformer_file(path, storage="bfloat16", compute_dtype=torch.bfloat16)
    assert_same_parameters(bf16_parts.transformer, loaded)
    assert public_config(loaded.config) == public_config(bf16_parts.transformer.config)


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("fmt", ["fp8_e4m3fn", "fp8_e4m3fn_scaled"])
def test_float8_transformer_files_load_the_stored_values(bf16_parts, tmp_path, fmt, prefix):
    path = write_transformer(bf16_parts, tmp_path, fmt, prefix)
    raw = load_file(str(path))
    assert (prefix + "scaled_fp8" in raw) == (fmt == "fp8_e4m3fn_scaled")
    loaded = load_transformer_file(path, storage="float8", compute_dtype=torch.float32)
    original = dequantized_state_dict(bf16_parts.transformer)
    for name, value in dequantized_state_dict(loaded).items():
        stored = raw[prefix + name]
        scale = raw.get(prefix + name.removesuffix("weight") + "scale_weight")
        assert torch.equal(value, stored.float() * (1.0 if scale is None else scale)), name  # what the file says
        if fmt == "fp8_e4m3fn" and stored.dtype == FLOAT8:  # a plain cast: the expected value is known exactly
            assert torch.equal(value, original[name].clamp(-448, 448).to(FLOAT8).float()), name
        relative = (value - original[name]).norm() / original[name].norm().clamp(min=1e-12)
        assert relative < 0.07, (name, relative)  # float8 keeps ~3 significant bits
    for name, linear in frozen_block_linears(loaded):  # block weights kept in float8, byte for byte
        assert linear.weight.dtype == FLOAT8
        assert torch.equal(linear.weight.view(torch.uint8), raw[f"{prefix}{name}.weight"].view(torch.uint8))


def comfy_quant_layout(tensors: dict, formats: dict | None = None) -> dict:
    """A scaled-fp8 file's tensors in ComfyUI 0.33's own layout for quantized layers (what its ModelSave
    writes): `<layer>.weight_scale` and a `<layer>.comfy_quant` JSON entry instead of `scale_weight` and
    the `scaled_fp8` marker."""
    import json

    out = {}
    for key, value in tensors.items():
        if key == "scaled_fp8":
            continue
        if key.endswith(".scale_weight"):
            layer = key[: -len(".scale_weight")]
            fmt = (formats or {}).get(layer, "float8_e4m3fn")
            out[layer + ".weight_scale"] = value
            out[layer + ".comfy_quant"] = torch.tensor(list(json.dumps({"format": fmt}).encode()), dtype=torch.uint8)
        else:
            out[key] = value
    return out


def test_comfyuis_own_quantized_layout_loads_like_the_scaled_fp8_file(bf16_parts, tmp_path):
    scaled_path = write_transformer(bf16_parts, tmp_path, "fp8_e4m3fn_scaled")
    scaled = load_transformer_file(scaled_path, storage="float8", compute_dtype=torch.float32)
    quant = comfy_quant_layout(load_file(str(scaled_path)))
    path = write_part_file(quant, tmp_path / "q.safetensors", "transformer", "fp8_e4m3fn_scaled",
                           public_config(bf16_parts.transformer.config))
    loaded = load_transformer_file(path, storage="float8", compute_dtype=torch.float32)
    a, b = dict(scaled.state_dict()), dict(loaded.state_dict())
    assert a.keys() == b.keys() and any(k.endswith("weight_scale") for k in a)
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key].float(), b[key].float()), key

    layer = next(k for k in quant if k.endswith(".comfy_quant"))[: -len(".comfy_quant")]
    nvfp4 = write_part_file(comfy_quant_layout(load_file(str(scaled_path)), {layer: "nvfp4"}),
                            tmp_path / "n.safetensors", "transformer", "fp8_e4m3fn_scaled",
                            public_config(bf16_parts.transformer.config))
    with pytest.raises(UserInputError, match=r"n\.safetensors has layers quantized as \['nvfp4'\]"):
        load_transformer_file(nvfp4)


def test_real_transformer_config_is_derived_from_its_shapes():
    from trainer_core.models.streaming import empty_transformer

    real = empty_transformer({})  # diffusers' defaults are Qwen-Image's: 60 blocks, 24 x 128 wide
    shapes = {name: tuple(p.shape) for name, p in real.named_parameters()}
    config = transformer_config(shapes, None, "qwen_image_bf16.safetensors")
    assert config == {k: real.config[k] if k != "axes_dims_rope" else tuple(real.config[k]) for k in config}
    assert config["num_layers"] == 60 and config["num_attention_heads"] == 24 and config["in_channels"] == 64


def test_tiny_transformer_without_its_json_is_refused_with_what_to_do(bf16_parts, tmp_path):
    path = write_transformer(bf16_parts, tmp_path, "bf16")
    path.with_suffix(".json").unlink()
    with pytest.raises(UserInputError, match=r"t\.safetensors has attention head size 16.*axes_dims_rope"):
        load_transformer_file(path)


# ----------------------------------------------------------------------------------------------------
# text encoder


def test_bf16_text_encoder_file_loads_the_language_model_exactly(bf16_parts, tmp_path):
    original = bf16_parts.text_encoder
    tensors = text_encoder_file_tensors(original, "bf16")
    assert {"model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.bias", "lm_head.weight"} <= set(tensors)
    assert any(k.startswith("visual.blocks.0.") for k in tensors)  # ComfyUI's layout keeps the vision tower
    path = write_part_file(tensors, tmp_path / "te.safetensors", "text encoder", "bf16", original.config.to_dict())
    loaded = load_text_encoder_file(path, compute_dtype=torch.bfloat16)
    language_model = [n for n, _ in original.named_parameters() if n.startswith("model.language_model.")]
    assert_same_parameters(original, loaded, language_model)  # vision tower and lm_head are not loaded


@pytest.mark.parametrize("prefix", ["text_encoders.qwen25_7b.transformer.", "qwen25_7b.transformer."])
def test_text_encoder_loads_under_comfyuis_save_prefixes(bf16_parts, tmp_path, prefix):
    """ComfyUI's CheckpointSave puts the encoder under `text_encoders.qwen25_7b.transformer.`, its CLIPSave
    under `qwen25_7b.transformer.` (next to a `qwen25_7b.logit_scale` that is no encoder tensor)."""
    original = bf16_parts.text_encoder
    tensors = {prefix + k: v for k, v in text_encoder_file_tensors(original, "bf16").items()}
    tensors[prefix.split(".transformer.")[0] + ".logit_scale"] = torch.tensor(4.6055)
    path = write_part_file(tensors, tmp_path / "te.safetensors", "text encoder", "bf16", original.config.to_dict())
    loaded = load_text_encoder_file(path, compute_dtype=torch.bfloat16)
    language_model = [n for n, _ in original.named_parameters() if n.startswith("model.language_model.")]
    assert_same_parameters(original, loaded, language_model)
    assert all(t.device.type == "cpu" for t in [*loaded.parameters(), *loaded.buffers()])  # nothing left on meta
    loaded.to(torch.device("cpu"))
    # Reference: transformers' own loading of the same weights (which, unlike `.to(bf16)` on the tiny
    # original, keeps the RoPE frequency buffers in fp32, as our loader does).
    from transformers import Qwen2_5_VLForConditionalGeneration

    original.save_pretrained(tmp_path / "hf")
    reference = Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path / "hf", dtype=torch.bfloat16)
    ours = encode_prompts(loaded, bf16_parts.tokenizer, PROMPTS)
    theirs = encode_prompts(reference, bf16_parts.tokenizer, PROMPTS)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_fp8_scaled_text_encoder_dequantized_or_kept_gives_the_stored_values(bf16_parts, tmp_path):
    original = bf16_parts.text_encoder
    path = write_part_file(text_encoder_file_tensors(original, "fp8_scaled"), tmp_path / "te8.safetensors",
                           "text encoder", "fp8_scaled", original.config.to_dict())
    raw = load_file(str(path))
    assert raw["scaled_fp8"].dtype == FLOAT8 and raw["scaled_fp8"].numel() == 0
    dequantized = load_text_encoder_file(path, compute_dtype=torch.float32, fp8="dequantize")
    kept = load_text_encoder_file(path, compute_dtype=torch.float32, fp8="keep")
    linears = [n for n, m in kept.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("model.")]
    assert len(linears) == 2 * 7
    for name in linears:
        stored, scale = raw[comfyui_name(name) + ".weight"], raw[comfyui_name(name) + ".scale_weight"]
        assert stored.dtype == FLOAT8 and scale.shape == ()
        assert torch.equal(dequantized.get_submodule(name).weight, stored.float() * scale)
        kept_linear = kept.get_submodule(name)
        assert kept_linear.weight.dtype == FLOAT8 and torch.equal(kept_linear.weight.view(torch.uint8), stored.view(torch.uint8))
        assert torch.equal(kept_linear.weight_scale, scale)
    a = encode_prompts(dequantized, bf16_parts.tokenizer, PROMPTS)
    b = encode_prompts(kept, bf16_parts.tokenizer, PROMPTS)
    reference = encode_prompts(copy.deepcopy(original).float(), bf16_parts.tokenizer, PROMPTS)
    for x, y, ref in zip(a, b, reference):
        assert torch.equal(x, y)  # fp32 compute: upcasting per call equals dequantising once
        assert (x - ref).norm() / ref.norm() < 0.1


def test_real_text_encoder_is_recognised_from_comfyui_names_and_others_refused():
    real = empty_text_encoder(QWEN25_VL_7B_CONFIG)
    comfy = {comfyui_name(n): tuple(p.shape) for n, p in real.named_parameters()}
    assert comfy["model.layers.0.self_attn.k_proj.bias"] == (512,)  # what ComfyUI detects Qwen2.5-VL 7B by
    assert comfy["model.layers.27.mlp.down_proj.weight"] == (3584, 18944)
    ours = {our_name(n): s for n, s in comfy.items()}
    assert text_encoder_config(ours, None, "qwen_2.5_vl_7b.safetensors") is QWEN25_VL_7B_CONFIG
    three_b = {n: (s[0], 2048) if n.endswith("embed_tokens.weight") else s for n, s in ours.items()}
    with pytest.raises(UserInputError, match="hidden_size': 2048.*Qwen2.5-VL 7B"):
        text_encoder_config(three_b, None, "qwen_2.5_vl_3b.safetensors")


# ----------------------------------------------------------------------------------------------------
# VAE


def test_wan_layout_vae_file_loads_exactly_and_encodes_and_decodes_alike(bf16_parts, tmp_path):
    original = bf16_parts.vae
    tensors = vae_file_tensors(original)
    assert {"decoder.middle.0.residual.0.gamma", "encoder.downsamples.0.residual.2.weight", "conv1.weight",
            "decoder.upsamples.2.resample.1.weight", "decoder.head.2.bias"} <= set(tensors)  # comfy/ldm/wan/vae.py
    path = write_part_file(tensors, tmp_path / "vae.safetensors", "vae", "bf16", public_config(original.config))
    loaded = load_vae_file(path, compute_dtype=torch.bfloat16)
    assert_same_parameters(original, loaded)
    assert public_config(loaded.config) == public_config(original.config)
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    latents = encode_images(original, images)
    assert torch.equal(encode_images(loaded, images), latents)
    assert torch.equal(decode_latents(loaded, latents), decode_latents(original, latents))


def test_vae_names_agree_with_diffusers_converter_and_real_config_is_derived():
    """diffusers 0.42.1's Wan VAE converter only knows the real config: there both must agree exactly."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKLQwenImage
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    with init_empty_weights():
        real = AutoencoderKLQwenImage()  # diffusers' defaults are Qwen-Image's VAE
    ours = {diffusers_to_wan_name(n, 2): n for n, _ in real.named_parameters()}
    theirs = {wan: name for name, wan in convert_wan_vae_to_diffusers({w: w for w in ours}).items()}
    assert ours == theirs and len(ours) == 194
    shapes = {diffusers_to_wan_name(n, 2): tuple(p.shape) for n, p in real.named_parameters()}
    assert vae_config_from_shapes(shapes, "wan", "qwen_image_vae.safetensors") == dict(
        base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, temperal_downsample=[False, True, True],
        attn_scales=[], input_channels=3)  # RGB (Qwen-Image-Layered's VAE has 4)


# ----------------------------------------------------------------------------------------------------
# wrong files


SDXL_LIKE = {
    "model.diffusion_model.input_blocks.0.0.weight": torch.zeros(8, 4, 3, 3),
    "model.diffusion_model.out.2.weight": torch.zeros(4, 8, 3, 3),
    "conditioner.embedders.0.transformer.text_model.embeddings.token_embedding.weight": torch.zeros(10, 8),
    "first_stage_model.decoder.conv_in.weight": torch.zeros(8, 4, 3, 3),
}


@pytest.mark.parametrize("load", [load_transformer_file, load_text_encoder_file, load_vae_file])
def test_an_sdxl_checkpoint_is_refused_naming_the_file(tmp_path, load):
    path = tmp_path / "sd_xl_base_1.0.safetensors"
    save_file(SDXL_LIKE, str(path))
    with pytest.raises(UserInputError, match=rf"{path}.*Stable Diffusion / SDXL checkpoint.*Choose qwen_"):
        load(path)


@pytest.mark.parametrize("load", [load_transformer_file, load_text_encoder_file, load_vae_file])
def test_a_missing_or_unreadable_file_is_refused_naming_it(tmp_path, load):
    with pytest.raises(UserInputError, match=rf"{tmp_path / 'nope.safetensors'} does not exist"):
        load(tmp_path / "nope.safetensors")
    (tmp_path / "broken.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UserInputError, match=rf"{tmp_path / 'broken.safetensors'} is not a readable"):
        load(tmp_path / "broken.safetensors")


def test_parts_swapped_or_mismatched_are_refused_before_loading(tiny_files, tmp_path):
    t, te, vae = tiny_files["transformer_bf16"], tiny_files["text_encoder_bf16"], tiny_files["vae"]
    with pytest.raises(UserInputError, match=rf"transformer file {vae} is not a Qwen-Image transformer: it looks "
                                             "like a Wan 2.1 / Qwen-Image VAE"):
        load_single_files(vae, te, t)
    with pytest.raises(UserInputError, match=rf"text encoder file {t} .* looks like a Qwen-Image transformer"):
        load_single_files(t, t, vae)
    wide = {n: torch.zeros(s[0], 32) if n.endswith("embed_tokens.weight") else torch.zeros(1)
            for n, s in [("model.embed_tokens.weight", (400, 16)), ("model.layers.0.self_attn.q_proj.weight", (1,))]}
    save_file(wide, str(tmp_path / "wide_te.safetensors"))
    with pytest.raises(UserInputError, match="makes features of width 32, but transformer file .* takes 16"):
        load_single_files(t, tmp_path / "wide_te.safetensors", vae)
    with pytest.raises(UserInputError, match="no tokenizer folder"):
        load_single_files(t, te, vae, tokenizer_dir=tmp_path / "no_tokenizer_here")


# ----------------------------------------------------------------------------------------------------
# all together


def test_components_from_single_files_train_and_reload_their_encoder(tiny_files, demo_folder, tmp_path):
    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.training import Trainer

    components = load_single_files(tiny_files["transformer_fp8_e4m3fn"], tiny_files["text_encoder_fp8_scaled"],
                                   tiny_files["vae"], storage="float8", compute_dtype=torch.float32,
                                   text_encoder_fp8="keep")
    assert components.name == "qwen_image_tiny_fp8_e4m3fn" and components.scheduler_config["max_shift"] == 0.9
    cached = cached_demo(components, demo_folder, tmp_path / "cache")
    components.release_text_encoder()
    components.ensure_text_encoder()  # read again from its file
    assert components.text_encoder.get_submodule("model.language_model.layers.0.mlp.up_proj").weight.dtype == FLOAT8
    trainer = Trainer(components, cached, LoraConfig(rank=2, alpha=2.0), OptimizerConfig(learning_rate=1e-3),
                      TrainConfig(run_name="files"))
    report = trainer.train(2)
    assert all(torch.isfinite(torch.tensor(report.losses)))
