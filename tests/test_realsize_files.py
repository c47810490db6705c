"""The real-layout random files (devtools/realsize_files.py): the shapes our loaders derive from their headers
are the real models', and a written file is a valid safetensors file with plausible values."""

import torch
from safetensors import safe_open

from trainer_core.devtools.realsize_files import SPECS, file_bytes, write_random_file
from trainer_core.models.layouts import SCALED_FP8_MARKER, split_scaled_fp8
from trainer_core.models.qwen_arch import QWEN25_VL_7B_CONFIG
from trainer_core.models.text_encoder_file import our_name, text_encoder_config
from trainer_core.models.transformer_file import transformer_config
from trainer_core.models.vae_file import vae_config


def shapes(part):
    return {name: shape for name, (shape, _) in SPECS[part]().items()}


def test_headers_describe_the_real_models():
    t = transformer_config(shapes("transformer"), None, "t")
    assert (t["num_layers"], t["num_attention_heads"], t["attention_head_dim"], t["joint_attention_dim"]) == (60, 24, 128, 3584)
    names, scales = split_scaled_fp8({n: n for n in shapes("text_encoder")})
    te = {our_name(n): s for n, s in shapes("text_encoder").items() if n in names and our_name(n) is not None}
    assert text_encoder_config(te, None, "te") is QWEN25_VL_7B_CONFIG
    assert len(scales) == sum(1 for n in shapes("text_encoder") if n.endswith(".scale_weight"))
    assert vae_config(shapes("vae"), "wan", None, "v")["dim_mult"] == [1, 2, 4, 4]


def test_file_sizes_are_the_real_files():
    """ComfyUI's files: 20.4 GB, 9.38 GB, 254 MB (sizes as published)."""
    sizes = {part: file_bytes(SPECS[part]()) for part in SPECS}
    assert round(sizes["transformer"] / 1e9, 1) == 20.4
    assert round(sizes["text_encoder"] / 1e9, 2) == 9.38
    assert round(sizes["vae"] / 1e6) == 254


def test_a_written_file_reads_back_with_plausible_values(tmp_path):
    specs = {
        "blocks.0.attn.to_q.weight": ((64, 32), torch.float8_e4m3fn),
        "blocks.0.attn.to_q.scale_weight": ((), torch.float32),
        "blocks.0.norm1.weight": ((32,), torch.bfloat16),
        "blocks.0.attn.to_q.bias": ((64,), torch.bfloat16),
        "embed.weight": ((100, 32), torch.bfloat16),
        SCALED_FP8_MARKER: ((0,), torch.float8_e4m3fn),
    }
    path = write_random_file(tmp_path / "f.safetensors", specs, seed=3)
    with safe_open(str(path), framework="pt") as f:
        read = {k: f.get_tensor(k) for k in f.keys()}
    assert {k: (tuple(v.shape), v.dtype) for k, v in read.items()} == specs
    assert torch.equal(read["blocks.0.norm1.weight"].float(), torch.ones(32))
    assert torch.equal(read["blocks.0.attn.to_q.bias"].float(), torch.zeros(64))
    weight = read["blocks.0.attn.to_q.weight"].float() * read["blocks.0.attn.to_q.scale_weight"]
    assert torch.isfinite(weight).all() and 0.005 < weight.std() < 0.05
    assert 0.005 < read["embed.weight"].float().std() < 0.05
