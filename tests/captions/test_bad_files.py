"""A text encoder file the captioner cannot use is refused with a UserInputError that names the file and what to
choose: an image model's file, a language model without its vision tower (1.x and 2.1), one without its head."""

from __future__ import annotations

import pytest
import torch
from caption_files import QWEN3_VL, QWEN25_VL, write_tiny_encoders

from trainer_core.core.errors import UserInputError


def load(path):
    from trainer_core.captions.model import load_vision_language_model

    return load_vision_language_model(path)


def test_an_image_models_file_is_refused(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "qwen_image_fp8_e4m3fn.safetensors"  # a transformer's keys (ComfyUI's layout)
    save_file({"txt_norm.weight": torch.ones(4), "transformer_blocks.0.attn.to_q.weight": torch.zeros(4, 4)}, str(path))
    with pytest.raises(UserInputError, match=r"qwen_image_fp8_e4m3fn.safetensors is not a vision-language .*transformer"
                                             r".*qwen_2\.5_vl_7b_fp8_scaled"):
        load(path)


def test_a_language_model_without_its_vision_tower_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    files = write_tiny_encoders(tmp_path, whole=False)
    with pytest.raises(UserInputError, match="Qwen2.5-VL language model without its vision tower"):
        load(files[QWEN25_VL])
    text_only = tmp_path / "qwen3vl_text_only.safetensors"
    save_file({k: v for k, v in load_file(str(files[QWEN3_VL])).items() if not k.startswith("visual.")}, str(text_only))
    text_only.with_suffix(".json").write_text(files[QWEN3_VL].with_suffix(".json").read_text())
    with pytest.raises(UserInputError, match="Qwen3-VL language model without its vision tower"):
        load(text_only)


def test_a_file_without_its_head_is_refused_unless_its_config_ties_it(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    files = write_tiny_encoders(tmp_path)
    headless = tmp_path / "qwen_2.5_vl_headless.safetensors"
    save_file({k: v for k, v in load_file(str(files[QWEN25_VL])).items() if k != "lm_head.weight"}, str(headless))
    sidecar = json.loads(files[QWEN25_VL].with_suffix(".json").read_text())
    headless.with_suffix(".json").write_text(json.dumps(sidecar))
    with pytest.raises(UserInputError, match="has no lm_head"):
        load(headless)
    sidecar["config"]["tie_word_embeddings"] = True  # the small Qwen-VL models' way: the embeddings are the head
    headless.with_suffix(".json").write_text(json.dumps(sidecar))
    model = load(headless).model
    assert model.lm_head.weight is model.get_input_embeddings().weight


def test_a_missing_file_is_refused_by_name(tmp_path):
    with pytest.raises(UserInputError, match="absent.safetensors does not exist"):
        load(tmp_path / "absent.safetensors")
