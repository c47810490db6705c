"""Our Qwen-Image 2.1 LoRA files against ComfyUI's own 2.1 model, which no runnable ComfyUI here has.

ComfyUI's model is `comfy/ldm/qwen_image21/model.py` (Comfy-Org/ComfyUI b806797696c10b92c8db8687b8842acf34db8d97,
read in the search index); a LoRA's keys must match its module names through ComfyUI's LoRA key map
(comfy/lora.py at 17358c8f, restated in comfy_lora_rules.comfy_key_map_newer). ComfyUI detects 2.1
(comfy/model_detection.py at 0b61ce5b) by `txt_in.text_norm.weight`, `modulation.1.weight`,
`transformer_blocks.0.attn.norm_q.weight`, `img_in.weight`, `proj_out.weight` and one of
`transformer_blocks.0.img_mlp.gate_up.weight` / `.proj.weight` under the file's prefix, and builds the model with
`fused_mlp` = whether the file holds `gate_up`: its MLP is fused exactly when its file is. model_base.QwenImage21
subclasses model_base.QwenImage, so the QwenImage branch of the key map applies, and the loaded model's keys are
its module names under `diffusion_model.` whatever the file's prefix.

The rule that decides the 2.1 layout: on a fused model the key map names `gate_up`'s two row halves by the split
names (bare, `transformer.` or `lycoris_`), and `gate_up` itself only as `diffusion_model.` / `lora_unet_`; on a
split model the split names are the model's own. So only the bare (or `transformer.`) split names match both
models; a `diffusion_model.` name or a fused `gate_up` LoRA matches one of them only.
"""

import pytest
import torch

from trainer_core.core.errors import UserInputError

from comfy_lora_rules import comfy_key_map_newer, unmatched_keys
from test_qwen_image21 import FAMILY, with_lora  # noqa: F401  (with_lora: a fixture)

# ComfyUI's 2.1 module names with their parameters' shapes (model.py at b8067976), in terms of the config:
# D = heads x head size (inner_dim), H = head size, C = context_in_dim, I / O = in / out channels, M = D x mlp_ratio.
# LayerNorms are elementwise_affine=False, every Linear bias=False, the rope embedder holds nothing: no other keys.
COMFY_OUTER = {
    "time_text_embed.timestep_embedder.linear_1.weight": ("D", 256),  # lightricks TimestepEmbedding, no bias
    "time_text_embed.timestep_embedder.linear_2.weight": ("D", "D"),
    "txt_in.text_norm.weight": ("C",),  # ZeroCenteredRMSNorm
    "txt_in.in_layer.weight": ("D", "C"),
    "txt_in.out_layer.weight": ("D", "D"),
    "img_in.weight": ("D", "I"),
    "modulation.1.weight": ("4D", "D"),  # nn.Sequential(SiLU, Linear): one modulation shared by every block
    "norm_out.linear.weight": ("D", "D"),
    "proj_out.weight": ("O", "D"),
}
COMFY_BLOCK = {  # under transformer_blocks.N.
    "attn.to_q.weight": ("D", "D"), "attn.to_k.weight": ("D", "D"), "attn.to_v.weight": ("D", "D"),
    "attn.to_out.0.weight": ("D", "D"), "attn.norm_q.weight": ("H",), "attn.norm_k.weight": ("H",),
    "img_mlp.out.weight": ("D", "M"),
}
COMFY_MLP_IN = {  # SwiGLUFeedForward(fused=...): one [gate; up] Linear, or the two
    "fused": {"img_mlp.gate_up.weight": ("2M", "D")},
    "split": {"img_mlp.proj.weight": ("M", "D"), "img_mlp.gate_layer.weight": ("M", "D")},
}


def comfy_state(config, mlp: str) -> dict[str, tuple[int, ...]]:
    """The loaded ComfyUI 2.1 model's state-dict keys (`diffusion_model.` + module names) and shapes."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    m = d * config["mlp_ratio"]
    sizes = {"D": d, "4D": 4 * d, "H": config["attention_head_dim"], "C": config["context_in_dim"],
             "I": config["in_channels"], "O": config["out_channels"], "M": m, "2M": 2 * m}
    names = dict(COMFY_OUTER)
    for n in range(config["num_layers"]):
        names |= {f"transformer_blocks.{n}.{k}": v for k, v in (COMFY_BLOCK | COMFY_MLP_IN[mlp]).items()}
    return {f"diffusion_model.{k}": tuple(sizes.get(s, s) for s in shape) for k, shape in names.items()}


@pytest.fixture(scope="module")
def plain21():
    """The tiny 2.1 transformer without a LoRA (with_lora's base weights: the same seed)."""
    from trainer_core.families import get_family

    return get_family(FAMILY).tiny_components(storage="float32").transformer


def modules_of(keys) -> set[str]:
    return {k.removesuffix(".weight").rsplit(".", 1)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0]
            for k in keys}


@pytest.mark.parametrize("mlp", ["fused", "split"])
def test_our_transformer_files_hold_comfyuis_module_names(plain21, mlp):
    """The recorded names and shapes are what our ComfyUI-layout 2.1 transformer writer writes (so the data
    above and the files ComfyUI loads agree), either MLP layout."""
    from trainer_core.families.qwen_image21.files import comfyui_transformer_tensors

    ours = {k: tuple(t.shape) for k, t in comfyui_transformer_tensors(plain21, "bf16", mlp,
                                                                      prefix="diffusion_model.").items()}
    assert ours == comfy_state(plain21.config, mlp)


@pytest.mark.parametrize("mlp", ["fused", "split"])
def test_comfyui_layout_lora_matches_every_key_of_comfyuis_21_model_and_merges_to_our_adapter(with_lora, plain21,
                                                                                                mlp):
    """Our comfyui-layout 2.1 LoRA: 0 unmatched keys under ComfyUI's key map for its 2.1 model with the MLP fused
    or split, every module onto a weight (or row half) of its shape, and the weights ComfyUI merges (W + alpha /
    rank * B A on each target rows) equal our adapter's merged weights."""
    from trainer_core.adapters.lora import adapter_weights
    from trainer_core.adapters.lora_files import lora_file_tensors

    transformer = with_lora.transformer
    tensors = lora_file_tensors(transformer, rank=2, alpha=3.0, dtype=torch.float32, layout="comfyui")
    state = comfy_state(transformer.config, mlp)
    key_map = comfy_key_map_newer(state)
    assert unmatched_keys(tensors, key_map) == []

    trained = adapter_weights(transformer)
    assert modules_of(tensors) == set(trained)  # each trained module once, rank 2, alpha 3
    base = {n: m.base_layer.weight.detach().float() for n, m in transformer.named_modules() if n in trained}
    merged_ours = {n: base[n] + 1.5 * b.float() @ a.float() for n, (a, b) in trained.items()}
    # ComfyUI's side: the model's weights as its file holds them (in that MLP layout), patched per key_map.
    plain = {k: v.detach() for k, v in plain21.state_dict().items()}  # the base weights by diffusers' names
    if mlp == "fused":
        for gate in [k for k in plain if k.endswith("img_mlp.gate_layer.weight")]:
            up = gate.replace("gate_layer", "proj")
            plain[gate.replace("gate_layer", "gate_up")] = torch.cat([plain.pop(gate), plain.pop(up)])
    comfy = {f"diffusion_model.{k}": v.float().clone() for k, v in plain.items()}
    assert {k: tuple(v.shape) for k, v in comfy.items()} == state
    patched = set()
    for module in modules_of(tensors):
        target, offset = key_map[module]
        a, b = tensors[f"{module}.lora_A.weight"], tensors[f"{module}.lora_B.weight"]
        alpha = float(tensors[f"{module}.alpha"])
        rows = comfy[target] if offset is None else comfy[target].narrow(*offset)
        assert rows.shape == (b.shape[0], a.shape[1]), module
        rows += alpha / a.shape[0] * (b @ a)
        patched.add((target, offset))
    assert len(patched) == len(trained)  # no two modules on the same rows
    for name, weight in merged_ours.items():
        if mlp == "fused" and name.endswith(("img_mlp.gate_layer", "img_mlp.proj")):
            fused = comfy[f"diffusion_model.{name.rsplit('.', 1)[0]}.gate_up.weight"]
            half = fused.shape[0] // 2
            theirs = fused[:half] if name.endswith("gate_layer") else fused[half:]
        else:
            theirs = comfy[f"diffusion_model.{name}.weight"]
        torch.testing.assert_close(theirs, weight, rtol=1e-6, atol=1e-7, msg=name)


def as_kohya(comfyui: dict) -> dict:
    """A 2.1 LoRA's comfyui-layout tensors (bare module names) under kohya's names: lora_unet_<module with _>."""
    parts = {".lora_A.weight": ".lora_down.weight", ".lora_B.weight": ".lora_up.weight", ".alpha": ".alpha"}
    out = {}
    for key, value in comfyui.items():
        suffix = next(s for s in parts if key.endswith(s))
        out["lora_unet_" + key[: -len(suffix)].replace(".", "_") + parts[suffix]] = value
    return out


def test_save_refuses_kohya_for_21_naming_the_layouts_that_load_whole(with_lora):
    """The kohya layout misses the MLP pair on ComfyUI's fused 2.1 files without an error (below; measured on ComfyUI's
    own 2.1 model too, tests/host/test_host_qwen_image21.py's host): Save refuses it for 2.1."""
    from trainer_core.adapters.lora_files import lora_file_tensors

    with pytest.raises(UserInputError, match="kohya is not one ComfyUI reads whole for Qwen-Image 2.1.*comfyui layout"):
        lora_file_tensors(with_lora.transformer, rank=2, alpha=3.0, dtype=torch.float32, layout="kohya")


def test_the_rejected_spellings_match_only_one_of_comfyuis_21_models(with_lora):
    """Why the bare split names: `diffusion_model.` + split names (and kohya's `lora_unet_`) miss the fused model's
    MLP, a fused `gate_up` LoRA misses the split model's."""
    from trainer_core.adapters.lora_files import lora_file_tensors

    transformer = with_lora.transformer
    tensors = lora_file_tensors(transformer, rank=2, alpha=3.0, dtype=torch.float32, layout="comfyui")
    maps = {mlp: comfy_key_map_newer(comfy_state(transformer.config, mlp)) for mlp in ("fused", "split")}
    prefixed = {f"diffusion_model.{k}": v for k, v in tensors.items()}
    kohya = as_kohya(tensors)  # as another trainer writes 2.1's kohya file (Save refuses the layout for 2.1, below)
    fused_names = {k.replace("img_mlp.gate_layer.", "img_mlp.gate_up."): v for k, v in prefixed.items()
                   if ".img_mlp.proj." not in k}
    blocks = transformer.config.num_layers
    mlp_keys = 2 * 3 * blocks  # gate_layer and proj: lora_A, lora_B, alpha per block
    assert unmatched_keys(prefixed, maps["split"]) == [] and len(unmatched_keys(prefixed, maps["fused"])) == mlp_keys
    assert unmatched_keys(kohya, maps["split"]) == [] and len(unmatched_keys(kohya, maps["fused"])) == mlp_keys
    assert unmatched_keys(fused_names, maps["fused"]) == []
    assert len(unmatched_keys(fused_names, maps["split"])) == 3 * blocks
