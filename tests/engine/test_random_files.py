"""Random-weight model files at the real size, as benchmarks/gpu_check.py writes them on a GPU machine: here
their headers only (sparse files, no data written), read by our loaders' header checks as the real files."""

import torch
from safetensors import safe_open

from trainer_core.devtools.random_files import write_random_text_encoder, write_random_transformer
from trainer_core.models.qwen_arch import QWEN25_VL_7B_CONFIG
from trainer_core.models.single_file import _shapes
from trainer_core.models.text_encoder_file import our_name, text_encoder_config
from trainer_core.planner.arch import real_arch, text_encoder_params


def test_realsize_headers_are_the_real_models(tmp_path):
    transformer = write_random_transformer(tmp_path / "qwen_image_fp8_e4m3fn.safetensors", header_only=True)
    encoder = write_random_text_encoder(tmp_path / "qwen_2.5_vl_7b_fp8_scaled.safetensors", header_only=True)
    assert not transformer.with_suffix(".json").exists()  # the real config comes from the shapes
    shapes = _shapes(transformer, "transformer")  # our loader's header check of the transformer file
    arch = real_arch()
    # per block: 14 Linears (weight and bias) and 4 q/k RMSNorm weights
    assert len([n for n in shapes if n.startswith("transformer_blocks.")]) == 60 * 32
    with safe_open(str(transformer), "pt") as f:
        kinds = {f.get_slice(n).get_dtype() for n in f.keys() if n.startswith("transformer_blocks.0.")}
    assert kinds == {"F8_E4M3", "BF16"}
    weights = sum(s[0] * s[1] for n, s in shapes.items() if n.startswith("transformer_blocks.") and len(s) == 2)
    assert weights == 60 * arch.block_linear_weight_params
    names = {our_name(n): s for n, s in _shapes(encoder, "text encoder").items() if our_name(n)}
    assert text_encoder_config(names, None, str(encoder)) == QWEN25_VL_7B_CONFIG
    params = sum(torch.Size(s).numel() for n, s in names.items() if not n.endswith(".scale_weight"))
    assert params == text_encoder_params()[0]  # what the planner counts as the loaded text encoder
    # The data is a hole of the right size: the files are as large as the real ones, on no disk space.
    assert transformer.stat().st_size > 19 * 2**30 and transformer.stat().st_blocks * 512 < 2**20


def test_whole_realsize_files_have_the_published_sizes(tmp_path):
    """ComfyUI's qwen_image_fp8_e4m3fn is 20.4 GB and qwen_2.5_vl_7b_fp8_scaled 9.38 GB (vision tower and lm_head
    included, which we never load): the rehearsal's files are those sizes."""
    transformer = write_random_transformer(tmp_path / "t.safetensors", header_only=True)
    encoder = write_random_text_encoder(tmp_path / "te.safetensors", header_only=True, whole=True)
    assert round(transformer.stat().st_size / 1e9, 1) == 20.4
    assert round(encoder.stat().st_size / 1e9, 2) == 9.38
    with safe_open(str(encoder), "pt") as f:
        keys = set(f.keys())
    assert "lm_head.weight" in keys and "visual.blocks.0.attn.qkv.scale_weight" in keys


def test_a_random_qwen3_vl_file_is_read_back_by_the_2_1_loader(tmp_path):
    """`random_files21.write_random_qwen3_vl` (the 2.1 rehearsal's text encoder) with a small config: ComfyUI's
    scaled-fp8 layout, every language and vision-block Linear float8 with its scale, which our 2.1 loader reads to
    weights equal to float8 x scale, every other tensor bf16; `lm_head` written but not loaded."""
    from trainer_core.families.qwen_image21.random_files import write_random_qwen3_vl
    from trainer_core.families.qwen_image21.text_file import comfyui_name, load_qwen3_vl_file
    from trainer_core.families.qwen_image21.tiny import tiny_text_config
    from trainer_core.models.layouts import SCALE_WEIGHT, SCALED_FP8_MARKER

    ids = {t: i for i, t in enumerate(("<|endoftext|>", "<|im_end|>", "<|image_pad|>", "<|video_pad|>",
                                       "<|vision_start|>", "<|vision_end|>"))}
    path = write_random_qwen3_vl(tmp_path / "qwen3vl_fp8_scaled.safetensors", seed=5, config=tiny_text_config(64, ids))
    model = load_qwen3_vl_file(path, compute_dtype=torch.float32)
    with safe_open(str(path), "pt") as f:
        keys = set(f.keys())
        assert SCALED_FP8_MARKER in keys and "model.lm_head.weight" in keys
        linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
                   and (".layers." in n or n.startswith("model.visual.blocks."))]
        assert len(linears) == 2 * 7 + 1 * 4  # 2 language layers x 7 Linears, 1 vision block x 4 (qkv, proj, MLP 2)
        for name in linears:
            stored = f.get_tensor(comfyui_name(name + ".weight"))
            assert stored.dtype == torch.float8_e4m3fn
            expected = stored.float() * f.get_tensor(comfyui_name(name) + SCALE_WEIGHT).float()
            assert torch.equal(model.get_submodule(name).weight, expected), name
        plain = [k for k in keys if not k.endswith(SCALE_WEIGHT) and k != SCALED_FP8_MARKER
                 and f.get_slice(k).get_dtype() != "F8_E4M3"]
        assert plain and all(f.get_slice(k).get_dtype() == "BF16" for k in plain)
        assert len([k for k in keys if f.get_slice(k).get_dtype() == "F8_E4M3"]) == len(linears) + 1  # + the marker


def test_random_int8_convrot_files_are_read_back_in_one_byte_by_the_2_1_loaders(tmp_path):
    """The 2.1 rehearsal's int8 files (`random_files.write_int8_convrot_file`, ComfyUI's int8 layout as the templates'
    `qwen3vl_8b_int8_convrot` / `qwen_image_2.1_int8_convrot`): every language and vision-block Linear of the text
    encoder, every block Linear of a real-width transformer block, int8 with one scale per row and its comfy_quant
    entry, kept in int8 by the loaders (the rotation where 256 divides the input features)."""
    from trainer_core.families.qwen_image21.random_files import write_random_qwen3_vl, write_random_transformer21
    from trainer_core.families.qwen_image21.files import QwenImage21TransformerFile
    from trainer_core.families.qwen_image21.text_file import load_qwen3_vl_file
    from trainer_core.families.qwen_image21.tiny import tiny_text_config
    from trainer_core.models.float8 import frozen_block_linears

    ids = {t: i for i, t in enumerate(("<|endoftext|>", "<|im_end|>", "<|image_pad|>", "<|video_pad|>",
                                       "<|vision_start|>", "<|vision_end|>"))}
    path = write_random_qwen3_vl(tmp_path / "qwen3vl_int8_convrot.safetensors", seed=5,
                                 config=tiny_text_config(64, ids), fmt="int8_convrot")
    model = load_qwen3_vl_file(path, compute_dtype=torch.float32, fp8="keep")
    linears = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
               and (".layers." in n or n.startswith("model.visual.blocks."))]
    assert len(linears) == 18 and all(m.weight.dtype == torch.int8 and m.weight_scale.shape == (m.out_features, 1)
                                      for m in linears)
    transformer = write_random_transformer21(tmp_path / "qwen_image_2.1_int8_convrot.safetensors", num_layers=1,
                                             fmt="int8_convrot")
    blocks = frozen_block_linears(QwenImage21TransformerFile(transformer).load())
    assert blocks and all(lin.weight.dtype == torch.int8 and lin.int8_rotation_group == 256 for _, lin in blocks)
