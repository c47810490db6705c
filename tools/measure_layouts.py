"""Print how far what each file layout loads is from what was written, on the tiny model (CPU, ~1 min).

    .venv/bin/python tools/measure_layouts.py

Per layout: max |loaded - original| over all weights (the fp32 original; the format's own rounding),
and max |loaded - expected| where `expected` is the original rounded the way the format stores it
(bf16, or float8 x scale): 0 means the loader adds no error of its own. Then module outputs, and the
LoRA layouts (diffusers' load_lora_weights vs the in-memory adapter; continuing from the file).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer_core.models.part_files import public_config, write_part_file  # noqa: E402
from trainer_core.families.qwen_image import build_tiny_components  # noqa: E402
from trainer_core.models.float8 import FLOAT8_MAX, FLOAT8, dequantized_state_dict, quantize_per_tensor  # noqa: E402
from trainer_core.models.text_encoder_file import load_text_encoder_file, text_encoder_file_tensors  # noqa: E402
from trainer_core.models.transformer_file import load_transformer_file, transformer_file_tensors  # noqa: E402
from trainer_core.models.vae_file import load_vae_file, vae_file_tensors  # noqa: E402


def max_diff(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def expected(tensor: torch.Tensor, fmt: str, is_linear_weight: bool) -> torch.Tensor:
    """The original as `fmt` stores it, back in fp32."""
    if fmt == "bf16" or not is_linear_weight:
        return tensor.to(torch.bfloat16).float()
    if fmt in ("fp8_e4m3fn",):
        return tensor.clamp(-FLOAT8_MAX, FLOAT8_MAX).to(FLOAT8).float()
    weight, scale = quantize_per_tensor(tensor)
    return weight.float() * scale


def linear_weights(module) -> set[str]:
    return {f"{n}.weight" for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)}


def main() -> None:
    original = build_tiny_components(seed=0, storage="float32")
    tmp = Path(tempfile.mkdtemp())
    print("layout                                       max|loaded-original|  max|loaded-expected|")

    plain = dequantized_state_dict(original.transformer)
    linears = linear_weights(original.transformer)
    for fmt in ("bf16", "fp8_e4m3fn", "fp8_e4m3fn_scaled"):
        for prefix in ("", "model.diffusion_model.", "model.", "diffusion_model.", "transformer."):
            path = write_part_file(transformer_file_tensors(original.transformer, fmt, prefix), tmp / "t.safetensors",
                                   "transformer", fmt, public_config(original.transformer.config))
            for storage in ("float32", "float8") if fmt != "bf16" else ("float32",):
                loaded = dequantized_state_dict(load_transformer_file(path, storage, torch.float32))
                want = {k: expected(v, fmt, k in linears) for k, v in plain.items()}
                print(f"transformer {fmt:18} {prefix or '(bare)':24} storage {storage:8} "
                      f"{max_diff(loaded, plain):.3e}  {max_diff(loaded, want):.3e}")

    te = original.text_encoder
    te_plain = {k: v for k, v in dequantized_state_dict(te).items() if k.startswith("model.language_model.")}
    te_linears = linear_weights(te)
    ids = original.tokenizer(["a red circle on a white background"], return_tensors="pt").input_ids
    with torch.no_grad():
        reference = te(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    for fmt in ("bf16", "fp8_scaled"):
        path = write_part_file(text_encoder_file_tensors(te, fmt), tmp / "te.safetensors", "text encoder", fmt,
                               te.config.to_dict())
        for mode in ("dequantize", "keep"):
            model = load_text_encoder_file(path, torch.float32, mode)
            loaded = dequantized_state_dict(model)
            want = {k: expected(v, "fp8_e4m3fn_scaled" if fmt == "fp8_scaled" else "bf16", k in te_linears)
                    for k, v in te_plain.items()}
            with torch.no_grad():
                hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
            print(f"text encoder {fmt:11} fp8={mode:10}                     {max_diff(loaded, te_plain):.3e}  "
                  f"{max_diff(loaded, want):.3e}   last hidden state vs original: "
                  f"{(hidden - reference).abs().max().item():.3e}")

    vae = original.vae
    path = write_part_file(vae_file_tensors(vae), tmp / "vae.safetensors", "vae", "bf16", public_config(vae.config))
    loaded_vae = load_vae_file(path, torch.float32)
    vae_plain = dequantized_state_dict(vae)
    rounded = build_tiny_components(seed=0, storage="float32").vae.to(torch.bfloat16).float()
    image = torch.rand(1, 3, 1, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        z = loaded_vae.encode(image).latent_dist.mode()
        encode_diff = (z - rounded.encode(image).latent_dist.mode()).abs().max().item()
        decode_diff = (loaded_vae.decode(z).sample - rounded.decode(z).sample).abs().max().item()
    print(f"vae wan-2.1 bf16                                          {max_diff(dequantized_state_dict(loaded_vae), vae_plain):.3e}  "
          f"{max_diff(dequantized_state_dict(loaded_vae), {k: v.to(torch.bfloat16).float() for k, v in vae_plain.items()}):.3e}"
          f"   encode / decode vs bf16-rounded original: {encode_diff:.3e} / {decode_diff:.3e}")
    measure_loras(tmp)


def measure_loras(tmp: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import cached_demo
    from diffusers import QwenImagePipeline

    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.runs.demo import make_demo_dataset
    from trainer_core.adapters.lora import adapter_weights
    from trainer_core.adapters.lora_files import LORA_LAYOUTS
    from trainer_core.training import Trainer

    folder = make_demo_dataset(tmp / "dataset")
    components = build_tiny_components(storage="float32")
    cached = cached_demo(components, folder, tmp / "cache")
    trainer = Trainer(components, cached, LoraConfig(rank=4, alpha=6.0, targets="all"),
                      OptimizerConfig(learning_rate=5e-3), TrainConfig(run_name="measure"))
    trainer.train(4)
    g = torch.Generator().manual_seed(0)
    inputs = dict(hidden_states=torch.randn(1, 16, 16, generator=g), encoder_hidden_states=torch.randn(1, 6, 16, generator=g),
                  timestep=torch.tensor([0.4]), img_shapes=[[(1, 4, 4)]], return_dict=False)
    with torch.no_grad():
        ours = trainer.built.transformer(**inputs)[0]
    live = adapter_weights(trainer.built.transformer)
    print("\nLoRA (rank 4, alpha 6)  diffusers load_lora_weights vs adapter | continued adapter weights vs trained")
    for layout in LORA_LAYOUTS:
        for dtype in (torch.float32, torch.bfloat16):
            path = trainer.save_lora(tmp / f"lora_{layout}.safetensors", dtype=dtype, layout=layout)
            fresh = build_tiny_components(storage="float32")
            pipe = QwenImagePipeline(scheduler=None, vae=fresh.vae, text_encoder=None, tokenizer=None,
                                     transformer=fresh.transformer)
            pipe.load_lora_weights(str(path))
            with torch.no_grad():
                theirs = fresh.transformer(**inputs)[0]
            more = Trainer(build_tiny_components(storage="float32"), cached, LoraConfig(), OptimizerConfig(),
                           TrainConfig(run_name="more"), init_lora=path)
            weights = adapter_weights(more.transformer)
            weight_diff = max(max((weights[m][0] - a).abs().max().item(), (weights[m][1] - b).abs().max().item())
                              for m, (a, b) in live.items())
            print(f"  {layout:9} {str(dtype).removeprefix('torch.'):8}  output {(ours - theirs).abs().max().item():.3e}"
                  f"   weights {weight_diff:.3e}")


if __name__ == "__main__":
    main()
