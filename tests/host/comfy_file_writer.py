"""Run by tests/host/test_host_files.py with ComfyUI's Python: ComfyUI itself writes Qwen-Image model files,
through the code a user runs in the canvas, and reports what its own modules compute from them.

    python comfy_file_writer.py <comfyui checkout> <request.json>

request.json: {"out_dir": folder the files go to, "inputs": a .safetensors of inputs, "outputs": path
               for ComfyUI's outputs, "text_config": the small text encoder's sizes, "seed": int}.

Only the weights' values come from here (seeded random numbers, since no real weights are at hand):
ComfyUI's loaders build its modules from them (UNETLoader, CLIPLoader and VAELoader code: comfy/sd.py),
and ComfyUI's save nodes (comfy_extras/nodes_model_merging.py: ModelSave, CheckpointSave, CLIPSave,
VAESave) write the files, with the names, prefixes and dtypes ComfyUI chooses:
- the transformer at the real width (ComfyUI fixes the widths, DESIGN §9) with ONE block, in bf16, as
  ComfyUI stores it for `weight_dtype fp8_e4m3fn` (the UNETLoader option), and loaded from a scaled-fp8
  state dict (the `scaled_fp8` marker and per-tensor `scale_weight` of ComfyUI's `_fp8_scaled` files),
  which ComfyUI 0.3.x saves back in that format and 0.33+ in its per-layer `comfy_quant` format;
- the Wan 2.1 VAE at its real size (ComfyUI derives the rest of its config);
- Qwen2.5-VL through ComfyUI's own Qwen-Image text encoder class, made small by the per-model config
  option ComfyUI's CLIP loader takes (`qwen25_7b_model_config`); its vision tower has ComfyUI's fixed
  width and is given zeros (Qwen-Image's text path never reads it);
- one checkpoint with all three parts.
Prints a JSON line {"files": {name: path}}. Nothing here imports this repository.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def random_state(module, seed: int, dtype, zero_prefixes=()) -> dict:
    """Seeded random tensors for every parameter of `module` (built on the meta device): weights of
    std 0.02 around 0, norm gains around 1, so activations stay finite at the real width."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in module.state_dict().items():
        if name.startswith(zero_prefixes):
            out[name] = torch.zeros(p.shape, dtype=dtype)
            continue
        t = torch.randn(p.shape, generator=g) * 0.02
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("gamma", "scale") or (leaf == "weight" and p.ndim == 1 and "norm" in name):
            t += 1.0
        out[name] = t.to(dtype)
    return out


def scaled_fp8_state(state: dict, linears: set) -> dict:
    """`state` with the weights of `linears` in float8_e4m3fn, one fp32 `scale_weight` per weight
    (real weight = float8 * scale), and the `scaled_fp8` marker: the layout of ComfyUI's `_fp8_scaled`
    files, which ComfyUI reads by that marker."""
    import torch

    out = {}
    for name, tensor in state.items():
        module, _, leaf = name.rpartition(".")
        if module in linears and leaf == "weight":
            scale = tensor.float().abs().max() / torch.finfo(torch.float8_e4m3fn).max
            out[name] = (tensor.float() / scale).to(torch.float8_e4m3fn)
            out[module + ".scale_weight"] = scale.reshape(())
        else:
            out[name] = tensor
    out["scaled_fp8"] = torch.tensor([], dtype=torch.float8_e4m3fn)
    return out


def cast_at_compute(module) -> None:
    """Let ComfyUI's operations cast their weights to the input's dtype, as ComfyUI's model patcher does
    for weights it keeps in another dtype (`comfy_cast_weights`): the forward below then runs in fp32."""
    for m in module.modules():
        if hasattr(m, "comfy_cast_weights"):
            m.comfy_cast_weights = True


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
    import comfy.sd
    import comfy.text_encoders.llama as llama
    import folder_paths

    request = json.loads(Path(request_file).read_text())
    out_dir, seed = Path(request["out_dir"]), request["seed"]
    inputs = load_file(request["inputs"])
    folder_paths.set_output_directory(str(out_dir))
    from comfy_extras.nodes_model_merging import CheckpointSave, CLIPSave, ModelSave, VAESave

    outputs: dict[str, torch.Tensor] = {}

    # Transformer: one block at Qwen-Image's real widths, bare diffusers names, as a file would hand them
    # to UNETLoader; comfy.sd.load_diffusion_model_state_dict detects the model and builds it.
    with torch.device("meta"):
        shapes = qwen_model.QwenImageTransformer2DModel(num_layers=1, operations=comfy.ops.disable_weight_init)
    state = random_state(shapes, seed, torch.bfloat16)
    block_linears = {n for n, m in shapes.named_modules()
                     if isinstance(m, torch.nn.Linear) and n.startswith("transformer_blocks.")}
    del shapes
    scaled = scaled_fp8_state(state, block_linears)
    models = {}
    for name, sd, options in (("bf16", state, {"dtype": torch.bfloat16}),
                              ("fp8_e4m3fn", state, {"dtype": torch.float8_e4m3fn}),
                              ("fp8_e4m3fn_scaled", scaled, {})):
        models[name] = comfy.sd.load_diffusion_model_state_dict(dict(sd), model_options=options)
        if models[name] is None:
            raise SystemExit(f"ComfyUI did not recognise the Qwen-Image transformer state dict ({name})")
    del state, scaled

    # VAE: the Wan 2.1 VAE at its real size (comfy/sd.py VAE reads base width and latent channels from
    # the tensors), as VAELoader builds it.
    with torch.device("meta"):
        shapes = wan_vae.WanVAE(dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                                temperal_downsample=[False, True, True], dropout=0.0)
    vae = comfy.sd.VAE(sd=random_state(shapes, seed + 1, torch.bfloat16))
    del shapes

    # Text encoder: CLIPLoader's code (comfy.sd.load_text_encoder_state_dicts) with type qwen_image.
    text = request["text_config"]
    small = dict(vocab_size=text["vocab_size"], hidden_size=text["hidden_size"],
                 intermediate_size=text["intermediate_size"], num_hidden_layers=text["num_hidden_layers"],
                 num_attention_heads=text["num_attention_heads"], num_key_value_heads=text["num_key_value_heads"])
    with torch.device("meta"):
        shapes = llama.Qwen25_7BVLI(small, dtype=torch.bfloat16, device="meta",
                                    operations=comfy.ops.disable_weight_init)
    te_state = random_state(shapes, seed + 2, torch.bfloat16, zero_prefixes=("visual.",))
    del shapes
    clip = comfy.sd.load_text_encoder_state_dicts([te_state], clip_type=comfy.sd.CLIPType.QWEN_IMAGE,
                                                  model_options={"qwen25_7b_model_config": small})
    del te_state

    # The files, written by ComfyUI's save nodes.
    ModelSave().save(models["bf16"], "diffusion_models/comfy_model_save_bf16")
    ModelSave().save(models["fp8_e4m3fn"], "diffusion_models/comfy_model_save_fp8_e4m3fn")
    ModelSave().save(models["fp8_e4m3fn_scaled"], "diffusion_models/comfy_model_save_fp8_e4m3fn_scaled")
    CheckpointSave().save(models["bf16"], clip, vae, "checkpoints/comfy_checkpoint")
    CLIPSave().save(clip, "text_encoders/comfy_clip_save")
    VAESave().save(vae, "vae/comfy_vae_save")
    files = {}
    for path in sorted(out_dir.rglob("*.safetensors")):
        files[path.parent.name + "/" + path.name.split("_0000")[0]] = str(path)

    # What ComfyUI's modules compute (fp32 compute; the transformer's weights stay as stored).
    with torch.no_grad():
        for name, patcher in models.items():
            model = patcher.model.diffusion_model
            cast_at_compute(model)
            outputs[f"transformer_{name}"] = model(inputs["latents"], inputs["timestep"], inputs["context"]).float()
        first_stage = vae.first_stage_model.float()
        outputs["vae_encode"] = first_stage.encode(inputs["image"]).float()
        # ComfyUI's VAE wrapper clamps decoded pixels (to [0, 1] after (x + 1) / 2, comfy/sd.py
        # process_output), diffusers' decoder to [-1, 1]: the same clamp.
        outputs["vae_decode"] = first_stage.decode(inputs["raw_latents"]).float().clamp(-1, 1)
        transformer = clip.cond_stage_model.qwen25_7b.transformer
        cast_at_compute(transformer)
        outputs["text_encoder"] = transformer.model(inputs["input_ids"], dtype=torch.float32)[0].float()
    save_file({k: v.contiguous() for k, v in outputs.items()}, request["outputs"])
    print(json.dumps({"files": files}))


if __name__ == "__main__":
    main()
