"""Qwen-Image 2.1's Qwen3-VL text encoder from ComfyUI's single file (families/qwen_image21/text_file.py).

The oracle for the layout is ComfyUI's own module: tests/data/comfy_qwen3vl_8b_keys.json holds the state-dict
names of `comfy.text_encoders.qwen3vl` (qwen3vl_8b, the model ComfyUI's 2.1 text encoder builds on), recorded from
a real ComfyUI 0.33.0 by tests/host/comfy_qwen3vl_probe.py. Our writer's names must be exactly those, and the reader
must give back the encoder, from ComfyUI's layout and from transformers' own.
"""

import json
import re

import pytest
import torch
from conftest import TESTS

from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image21.text_file import comfyui_text_encoder_tensors, load_qwen3_vl_file
from trainer_core.models.source import FILES

COMFY_KEYS = json.loads((TESTS / "data" / "comfy_qwen3vl_8b_keys.json").read_text())


def small_encoder(deepstack=(0,)):
    """A small Qwen3-VL with every kind of tensor ComfyUI's has (a DeepStack merger too)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from trainer_core.families.qwen_image21.tiny import tiny_text_config

    config = tiny_text_config(64, {t: i for i, t in enumerate(("<|im_end|>", "<|endoftext|>", "<|image_pad|>",
                                                               "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"))})
    config["vision_config"].update(depth=2, deepstack_visual_indexes=list(deepstack))
    torch.manual_seed(0)
    return Qwen3VLForConditionalGeneration(Qwen3VLConfig(**config)).eval()


def write(tmp_path, tensors, config):
    from safetensors.torch import save_file

    path = tmp_path / "qwen3vl.safetensors"
    save_file(tensors, str(path))
    path.with_suffix(".json").write_text(json.dumps({"part": "text encoder", "config": config.to_dict()}))
    return path


def test_the_written_names_are_comfyuis_qwen3vl_8b_names():
    names = comfyui_text_encoder_tensors(small_encoder()).keys()
    assert sorted({re.sub(r"\.\d+\.", ".#.", n) for n in names}) == COMFY_KEYS["patterns"]


@pytest.mark.parametrize("layout", ["comfyui", "transformers"])
def test_a_file_in_either_layout_reads_back_to_the_encoder(tmp_path, layout):
    encoder = small_encoder()
    tensors = (comfyui_text_encoder_tensors(encoder, torch.float32) if layout == "comfyui"
               else {n: t.contiguous() for n, t in encoder.state_dict().items()})
    loaded = load_qwen3_vl_file(write(tmp_path, tensors, encoder.config), torch.float32)
    want = {n: t for n, t in encoder.state_dict().items() if not n.startswith("lm_head.")}  # lm_head: not loaded
    got = loaded.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)
    ids = torch.tensor([[1, 7, 9, 11]])
    with torch.no_grad():
        a = encoder(input_ids=ids, output_hidden_states=True).hidden_states
        b = loaded(input_ids=ids, output_hidden_states=True).hidden_states
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_file_of_another_model_without_its_config_is_refused(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file(comfyui_text_encoder_tensors(small_encoder()), str(path))
    with pytest.raises(UserInputError, match="is not Qwen3-VL-8B .found width 16, 2 layers, 2 vision blocks"):
        load_qwen3_vl_file(path)


def test_the_21_load_path_reads_the_text_encoder_file_and_the_folders_vae(tmp_path):
    from trainer_core.families import get_family
    from trainer_core.families import get_family
    from trainer_core.families.qwen_image21.text import encode_prompt
    from trainer_core.families.loading import LoadRequest, load_model_set

    files = get_family("qwen-image-2.1").export_tiny(tmp_path)
    tiny = get_family("qwen-image-2.1").tiny_components(storage="float32")
    components = load_model_set(LoadRequest(FILES, torch.device("cpu"), storage="float32", compute_dtype="float32",
                                 transformer=files["transformer_bf16"], text_encoder=files["text_encoder"],
                                 diffusers_folder=files["diffusers_folder"]))
    rounded = {n: t.bfloat16().float() for n, t in tiny.text_encoder.state_dict().items() if not n.startswith("lm_")}
    assert components.text_encoder is None  # lazy: read when the cache misses
    components.ensure_text_encoder()
    got = components.text_encoder.state_dict()
    assert got.keys() == rounded.keys() and all(torch.equal(got[n], rounded[n]) for n in rounded)
    tiny.text_encoder.load_state_dict(rounded, strict=False)  # the same bf16 values: the same prompt embedding
    prompt = "a red square on white"
    assert torch.equal(encode_prompt(components.text_encoder, components.tokenizer, prompt),
                       encode_prompt(tiny.text_encoder, tiny.tokenizer, prompt))


def test_a_scaled_float8_file_reads_as_its_dequantized_values(tmp_path):
    """ComfyUI's scaled-fp8 text encoder files: each decoder Linear in float8 with a `scale_weight` and the
    `scaled_fp8` marker; read back as float8 x scale in the compute dtype."""
    from trainer_core.models.float8 import FLOAT8, quantize_per_tensor
    from trainer_core.models.layouts import SCALE_WEIGHT, SCALED_FP8_MARKER

    encoder = small_encoder()
    tensors = comfyui_text_encoder_tensors(encoder, torch.float32)
    expected = {}
    for name in [n for n in tensors if n.startswith("model.layers.") and n.endswith("_proj.weight")]:
        tensors[name], scale = quantize_per_tensor(tensors[name])
        tensors[name.removesuffix(".weight") + SCALE_WEIGHT] = scale
        expected[name] = tensors[name].float() * scale
    tensors[SCALED_FP8_MARKER] = torch.tensor([], dtype=FLOAT8)
    loaded = load_qwen3_vl_file(write(tmp_path, tensors, encoder.config), torch.float32).state_dict()
    assert len(expected) == 2 * 7  # q, k, v, o, gate, up, down of both layers
    for name, want in expected.items():
        assert torch.equal(loaded["model.language_model." + name.removeprefix("model.")], want)
    assert torch.equal(loaded["model.visual.patch_embed.proj.weight"], encoder.model.visual.patch_embed.proj.weight)
