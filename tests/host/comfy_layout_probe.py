"""Run by tests/host/test_host_layouts.py with ComfyUI's Python: load our exported files into ComfyUI's OWN
module classes with strict key matching and write their outputs on given inputs.

    python comfy_layout_probe.py <comfyui checkout> <request.json>

request.json: {"files": {name: path}, "inputs": path of a .safetensors of inputs, "out": output path,
               "loras": {layout: path of a LoRA file for the tiny transformer}}.
Every module is built the way ComfyUI builds it for that file (plain or scaled-fp8 operations), with
the tiny widths read from the config JSON beside the file. Works on ComfyUI releases before and after
the removal of `comfy.ops.scaled_fp8_ops` (0.3.x and 0.33+): what a release offers is detected, not its
version number. Nothing here imports this repository.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def sidecar(path: str) -> dict:
    return json.loads(Path(path).with_suffix(".json").read_text())["config"]


def strict_load(module, state: dict, name: str) -> None:
    result = module.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise SystemExit(f"{name}: keys differ from ComfyUI's module: missing {result.missing_keys[:5]}, "
                         f"unexpected {result.unexpected_keys[:5]}")


def scaled_fp8_loading(state: dict, compute_dtype):
    """The operations this ComfyUI builds a module with for a file that carries the `scaled_fp8` marker,
    and the state dict as those operations take it.

    Releases that have `comfy.ops.scaled_fp8_ops` (0.3.x) pop the marker and load the `scale_weight` keys
    as they are (comfy/model_detection.py, comfy/sd1_clip.py). Later ones (0.33+) have no such class: they
    rewrite the old keys into per-layer quantization entries (comfy.utils.convert_old_quants, called by
    comfy/sd.py on every file it loads) and build mixed-precision operations from those entries; without
    fp8 compute (the CPU) every layer is dequantized and multiplied in the compute dtype, as
    comfy.ops.pick_operations sets up on such a device."""
    import torch

    import comfy.ops
    import comfy.utils

    if hasattr(comfy.ops, "scaled_fp8_ops"):
        state = dict(state)
        state.pop("scaled_fp8")
        return comfy.ops.scaled_fp8_ops(fp8_matrix_mult=False, scale_input=False,
                                        override_dtype=torch.float8_e4m3fn), state
    state, _ = comfy.utils.convert_old_quants(dict(state), model_prefix="", metadata={})
    quant_config = comfy.utils.detect_layer_quantization(state, "")
    if not quant_config:
        raise SystemExit("this ComfyUI has neither comfy.ops.scaled_fp8_ops nor converts `scaled_fp8` files "
                         "into per-layer quantization entries: the probe does not know how it loads them")
    return comfy.ops.mixed_precision_ops(quant_config, compute_dtype, full_precision_mm=True), state


def main() -> None:
    comfy_root, request_file = sys.argv[1], sys.argv[2]
    sys.path.insert(0, comfy_root)
    import torch
    from safetensors.torch import load_file, save_file

    from comfy.cli_args import args

    args.cpu = True  # as `main.py --cpu`: comfy.model_management reads it at import
    import comfy.ldm.qwen_image.model as qwen_model
    import comfy.ldm.wan.vae as wan_vae
    import comfy.ops
    import comfy.text_encoders.llama as llama

    request = json.loads(Path(request_file).read_text())
    files, inputs = request["files"], load_file(request["inputs"])
    out: dict[str, torch.Tensor] = {}

    # Transformer: comfy/ldm/qwen_image/model.py. The scaled file carries the `scaled_fp8` marker, which
    # selects ComfyUI's scaled-fp8 loading (see scaled_fp8_loading).
    for name in ("transformer_bf16", "transformer_fp8_e4m3fn", "transformer_fp8_e4m3fn_scaled"):
        cfg = sidecar(files[name])
        state = load_file(files[name])
        scaled = "scaled_fp8" in state
        operations, state = scaled_fp8_loading(state, torch.float32) if scaled else (comfy.ops.manual_cast, state)
        model = qwen_model.QwenImageTransformer2DModel(
            patch_size=cfg["patch_size"], in_channels=cfg["in_channels"], out_channels=cfg["out_channels"],
            num_layers=cfg["num_layers"], attention_head_dim=cfg["attention_head_dim"],
            num_attention_heads=cfg["num_attention_heads"], joint_attention_dim=cfg["joint_attention_dim"],
            axes_dims_rope=tuple(cfg["axes_dims_rope"]), dtype=torch.float32,
            operations=operations)
        strict_load(model, state, name)
        with torch.no_grad():
            out[name] = model(inputs["latents"], inputs["timestep"], inputs["context"]).float()
        if scaled:
            # ComfyUI 0.3.x's scaled-fp8 Linear is created in float8 as a whole, so loading rounds the file's
            # bf16 biases to float8. With the file's biases put back, what remains is the layout itself.
            # (Later releases keep biases in the compute dtype: then nothing is put back.)
            for key, value in state.items():
                module_name, _, leaf = key.rpartition(".")
                if leaf == "bias" and model.get_submodule(module_name).bias.dtype == torch.float8_e4m3fn:
                    model.get_submodule(module_name).bias = torch.nn.Parameter(value.float(), requires_grad=False)
            with torch.no_grad():
                out[name + "_file_biases"] = model(inputs["latents"], inputs["timestep"], inputs["context"]).float()

    # VAE: comfy/ldm/wan/vae.py, as comfy/sd.py builds it (attn_scales [], dropout 0).
    cfg = sidecar(files["vae"])
    vae = wan_vae.WanVAE(dim=cfg["base_dim"], z_dim=cfg["z_dim"], dim_mult=cfg["dim_mult"],
                         num_res_blocks=cfg["num_res_blocks"], attn_scales=[],
                         temperal_downsample=cfg["temperal_downsample"], dropout=0.0)
    strict_load(vae, {k: v.float() for k, v in load_file(files["vae"]).items()}, "vae")
    with torch.no_grad():
        out["vae_encode"] = vae.encode(inputs["image"])
        out["vae_decode"] = vae.decode(inputs["raw_latents"]).clamp(-1, 1)

    # Text encoder: comfy/text_encoders/llama.py. Qwen25_7BVLI is Llama2_ under `model.` plus a vision
    # tower whose width ComfyUI fixes at the real model's, so the tiny test builds the language model
    # (the part Qwen-Image uses) with the Qwen2.5-7B config class and the tiny sizes, and matches every
    # `model.*` key of the file strictly. The scaled file is built with the scaled-fp8 loading of this
    # ComfyUI (comfy/sd1_clip.py, comfy/sd.py; see scaled_fp8_loading).
    for name in ("text_encoder_bf16", "text_encoder_fp8_scaled"):
        text = sidecar(files[name])["text_config"]
        cfg = llama.Qwen25_7BVLI_Config(
            vocab_size=text["vocab_size"], hidden_size=text["hidden_size"], intermediate_size=text["intermediate_size"],
            num_hidden_layers=text["num_hidden_layers"], num_attention_heads=text["num_attention_heads"],
            num_key_value_heads=text["num_key_value_heads"], rms_norm_eps=text["rms_norm_eps"],
            rope_theta=text["rope_parameters"]["rope_theta"])
        cfg.head_dim = text["hidden_size"] // text["num_attention_heads"]
        cfg.rope_dims = text["rope_parameters"]["mrope_section"]
        state = load_file(files[name])
        scaled = "scaled_fp8" in state
        operations, state = scaled_fp8_loading(state, torch.float32) if scaled else (comfy.ops.manual_cast, state)
        wrapper = torch.nn.Module()
        wrapper.model = llama.Llama2_(cfg, device="cpu", dtype=torch.float32, ops=operations)
        strict_load(wrapper, {k: v for k, v in state.items() if k.startswith("model.")}, name)
        with torch.no_grad():
            out[name] = wrapper.model(inputs["input_ids"], dtype=torch.float32)[0].float()

    # LoRA files: ComfyUI's own key map for a Qwen-Image model (comfy/lora.py model_lora_keys_unet, which
    # only needs the model's weight names and class) and its own loader and weight patching. Each patched
    # weight's change, ComfyUI's strength 1.0 applied to a zero weight, is the adapter's delta.
    import logging
    import types

    import comfy.lora
    import comfy.model_base

    names = load_file(files["transformer_bf16"])
    model = object.__new__(comfy.model_base.QwenImage)  # no weights are built: only names and class are read
    object.__setattr__(model, "state_dict", lambda: {f"diffusion_model.{k}": v for k, v in names.items()})
    object.__setattr__(model, "model_config", types.SimpleNamespace(unet_config={"image_model": "qwen_image"}))
    key_map = comfy.lora.model_lora_keys_unet(model, {})
    not_loaded: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: not_loaded.append(record.getMessage()) if "not loaded" in record.getMessage() else None
    logging.getLogger().addHandler(handler)
    for layout, path in request.get("loras", {}).items():
        patches = comfy.lora.load_lora(load_file(path), key_map)
        for key, adapter in patches.items():
            zero = torch.zeros_like(names[key[len("diffusion_model."):]], dtype=torch.float32)
            out[f"lora.{layout}.{key}"] = comfy.lora.calculate_weight([(1.0, adapter, 1.0, None, None)], zero, key)
    out["lora_keys_not_loaded"] = torch.tensor(float(len(not_loaded)))

    save_file({k: v.contiguous() for k, v in out.items()}, request["out"])
    print(json.dumps({"ok": sorted(out)}))


if __name__ == "__main__":
    main()
