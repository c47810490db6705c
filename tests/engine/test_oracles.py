"""Tests against oracles we did not write (diffusers 0.42.1, peft, transformers): a symmetric bug in our
writer and our reader cannot pass them.

- LoRA files, ours in every layout and third-party ones built here (diffusers' own `save_lora_weights`
  output of a peft adapter; a kohya/musubi `lora_unet_` file), read by diffusers' Qwen-Image LoRA loader:
  per module the delta W' - W (peft's `get_delta_weight`) equals alpha / rank * B @ A of our in-memory
  adapter or of our reader's result, and the forward output matches.
- The timestep shift: mu and the shifted noise level of our objective and of a Trainer's steps against
  diffusers' `calculate_shift` and `FlowMatchEulerDiscreteScheduler` built from Qwen-Image's config.
- Single-file loaders on files written independently of our exporter: `save_pretrained` output of the
  real diffusers / transformers classes, renamed here to ComfyUI's single-file layouts.
"""

import json
import re

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from conftest import cached_demo, first_call, one_step_loss
from test_lora_format import forward_inputs
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.adapters.lora import adapter_weights
from trainer_core.adapters.lora_files import LORA_LAYOUTS
from trainer_core.adapters.lora_reading import read_lora_file
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.models.scheduler import QWEN_IMAGE_SCHEDULER_CONFIG
from trainer_core.training.objective import resolution_mu, sample_noise_levels
from trainer_core.training import Trainer, randomness

FLOAT8 = torch.float8_e4m3fn


# ====================================================================================================
# LoRA files through diffusers' loader


def diffusers_with_lora(path):
    """A fresh seed-0 tiny transformer with the LoRA file loaded by `QwenImagePipeline.load_lora_weights`."""
    from diffusers import QwenImagePipeline

    fresh = build_tiny_components(storage="float32")
    pipe = QwenImagePipeline(scheduler=None, vae=fresh.vae, text_encoder=None, tokenizer=None,
                             transformer=fresh.transformer)
    pipe.load_lora_weights(str(path))
    return fresh.transformer


def diffusers_deltas(transformer) -> dict[str, torch.Tensor]:
    """Module -> the weight delta peft applies (scaling * B @ A, peft's own arithmetic), one adapter each."""
    from peft.tuners.lora import LoraLayer

    out = {}
    for name, layer in transformer.named_modules():
        if isinstance(layer, LoraLayer):
            (adapter,) = layer.lora_A.keys()
            out[name] = layer.get_delta_weight(adapter)
    return out


def deltas(weights, alpha: float, rank: int) -> dict[str, torch.Tensor]:
    """Module -> alpha / rank * B @ A in fp32, from (A, B) pairs."""
    return {m: (alpha / rank) * (b.detach().float() @ a.detach().float()) for m, (a, b) in weights.items()}


def assert_same_deltas(theirs: dict, ours: dict, rtol: float):
    """Same modules; per module max |difference| <= rtol x the largest |entry| of our delta."""
    assert sorted(theirs) == sorted(ours)
    for module, delta in ours.items():
        assert delta.abs().max() > 0, module
        assert (theirs[module] - delta).abs().max() <= rtol * delta.abs().max(), module


@pytest.mark.parametrize("layout", LORA_LAYOUTS)
def test_diffusers_loads_our_files_to_the_trained_deltas_and_output(trained_lora, tmp_path, layout):
    path = trained_lora.save_lora(tmp_path / "lora.safetensors", dtype=torch.float32, layout=layout)
    theirs = diffusers_with_lora(path)
    cfg = trained_lora.lora_cfg
    # fp32: diffusers folds alpha / rank = 1.5 into A (kohya, comfyui) and we into B (diffusers): one rounding.
    ours = adapter_weights(trained_lora.built.transformer)
    assert_same_deltas(diffusers_deltas(theirs), deltas(ours, cfg.alpha, cfg.rank), rtol=1e-6)
    with torch.no_grad():
        ours_out = trained_lora.built.transformer(**forward_inputs())[0]
        theirs_out = theirs(**forward_inputs())[0]
        base = build_tiny_components(storage="float32").transformer(**forward_inputs())[0]
    assert (ours_out - base).abs().max() > 1e-4  # the adapter does something
    assert (ours_out - theirs_out).abs().max() < 1e-6


# Modules of the third-party files: attention, MLP, modulation and an outer module (not a preset).
THIRD_PARTY_MODULES = ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.add_k_proj",
                       "transformer_blocks.0.txt_mod.1", "transformer_blocks.1.img_mlp.net.0.proj",
                       "transformer_blocks.1.attn.to_out.0", "img_in"]


def continued_from(path, demo_folder, cache_dir):
    """A Trainer started from the LoRA file: our reader's result put into our adapter."""
    components = build_tiny_components(storage="float32")
    return Trainer(components, cached_demo(components, demo_folder, cache_dir), LoraConfig(rank=16, alpha=1.0),
                   OptimizerConfig(learning_rate=1e-3), TrainConfig(run_name="third_party"), init_lora=path)


def assert_output_matches(ours, theirs):
    with torch.no_grad():
        a, b = ours(**forward_inputs())[0], theirs(**forward_inputs())[0]
        base = build_tiny_components(storage="float32").transformer(**forward_inputs())[0]
    assert (a - base).abs().max() > 1e-3
    assert (a - b).abs().max() <= 1e-5 * b.abs().max()  # fp32, alpha folded into other factors


def test_a_diffusers_saved_lora_reads_alike_in_ours_and_in_diffusers(tmp_path, demo_folder, tiny_cache):
    """diffusers' own layout, as `QwenImagePipeline.save_lora_weights` writes a peft adapter (the way its
    training scripts do: alpha only in the `lora_adapter_metadata`, alpha != rank)."""
    from diffusers import QwenImagePipeline
    from peft import LoraConfig as PeftLoraConfig
    from peft.utils import get_peft_model_state_dict

    source = build_tiny_components(storage="float32").transformer
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)  # init_lora_weights=False: A and B both random, so every delta is non-zero
        source.add_adapter(PeftLoraConfig(r=4, lora_alpha=8, target_modules=THIRD_PARTY_MODULES,
                                          init_lora_weights=False))
    QwenImagePipeline.save_lora_weights(tmp_path, transformer_lora_layers=get_peft_model_state_dict(source),
                                        transformer_lora_adapter_metadata=source.peft_config["default"].to_dict())
    path = tmp_path / "pytorch_lora_weights.safetensors"
    assert all(k.startswith("transformer.") for k in load_file(str(path)))

    lora = read_lora_file(path)
    assert (lora.rank, lora.alpha, sorted(lora.targets)) == (4, 8.0, sorted(THIRD_PARTY_MODULES))
    for module, (a, b) in adapter_weights(source).items():
        assert torch.equal(lora.weights[module][0], a) and torch.equal(lora.weights[module][1], b), module
    theirs = diffusers_with_lora(path)
    expected = diffusers_deltas(source)  # the adapter that was saved, peft's arithmetic
    assert_same_deltas(diffusers_deltas(theirs), expected, rtol=0)
    assert_same_deltas(deltas(lora.weights, lora.alpha, lora.rank), expected, rtol=1e-6)
    more = continued_from(path, demo_folder, tiny_cache)
    assert (more.decided.lora.rank, more.decided.lora.alpha) == (4, 8.0)
    assert_output_matches(more.built.transformer, theirs)


def test_a_kohya_musubi_lora_reads_alike_in_ours_and_in_diffusers(tmp_path, demo_folder, tiny_cache):
    """The `lora_unet_` layout of kohya-style trainers (musubi-tuner): lora_down / lora_up, '.' of the
    module name as '_', a scalar alpha per module, all in bf16 as musubi saves them. alpha / rank = 2, so
    diffusers' folding of the scale into lora_down is exact in bf16 and the deltas must agree exactly."""
    rank, alpha = 4, 8.0
    source = build_tiny_components(storage="float32").transformer
    linears = dict(source.named_modules())
    g = torch.Generator().manual_seed(3)
    tensors, expected = {}, {}
    for module in THIRD_PARTY_MODULES:
        linear = linears[module]
        down = (torch.randn(rank, linear.in_features, generator=g) * 0.1).to(torch.bfloat16)
        up = (torch.randn(linear.out_features, rank, generator=g) * 0.1).to(torch.bfloat16)
        stem = "lora_unet_" + module.replace(".", "_")
        tensors |= {f"{stem}.lora_down.weight": down, f"{stem}.lora_up.weight": up,
                    f"{stem}.alpha": torch.tensor(alpha, dtype=torch.bfloat16)}
        expected[module] = (down, up)
    path = tmp_path / "musubi.safetensors"
    save_file(tensors, str(path), metadata={"ss_network_dim": str(rank), "ss_network_alpha": str(alpha)})

    lora = read_lora_file(path)
    assert (lora.layout, lora.rank, lora.alpha, sorted(lora.targets)) == ("kohya", rank, alpha, sorted(THIRD_PARTY_MODULES))
    for module, (down, up) in expected.items():
        assert torch.equal(lora.weights[module][0], down) and torch.equal(lora.weights[module][1], up), module
    theirs = diffusers_with_lora(path)
    assert_same_deltas(diffusers_deltas(theirs), deltas(expected, alpha, rank), rtol=0)
    more = continued_from(path, demo_folder, tiny_cache)
    assert_same_deltas(deltas(adapter_weights(more.built.transformer), alpha, rank), deltas(expected, alpha, rank),
                       rtol=0)
    assert_output_matches(more.built.transformer, theirs)


# ====================================================================================================
# timestep shift against diffusers' scheduler


def qwen_scheduler(**overrides):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler.from_config({**QWEN_IMAGE_SCHEDULER_CONFIG, **overrides})


def pipeline_mu(image_tokens: int, scheduler) -> float:
    """mu exactly as `QwenImagePipeline.__call__` computes it from its scheduler's config."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    c = scheduler.config
    return calculate_shift(image_tokens, c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
                           c.get("base_shift", 0.5), c.get("max_shift", 1.15))


@pytest.mark.parametrize("image_tokens", [16, 256, 1024, 3600, 4096, 6889, 8192, 16384])
def test_resolution_mu_and_shift_equal_the_qwen_image_scheduler(image_tokens):
    scheduler = qwen_scheduler()
    assert scheduler.config.use_dynamic_shifting and scheduler.config.time_shift_type == "exponential"
    mu = resolution_mu(image_tokens, QWEN_IMAGE_SCHEDULER_CONFIG)
    assert mu == pipeline_mu(image_tokens, scheduler)
    g = torch.Generator().manual_seed(image_tokens)
    unshifted = sample_noise_levels(64, g, "logit_normal")
    shifted = sample_noise_levels(64, g.manual_seed(image_tokens), "logit_normal", mu=mu)
    assert torch.equal(shifted, scheduler.time_shift(mu, 1.0, unshifted))
    # The same through the scheduler's own schedule (set_timesteps with mu; its terminal stretch, an
    # inference-only step, left out), computed there in float64.
    plain = qwen_scheduler(shift_terminal=None)
    plain.set_timesteps(sigmas=unshifted.double().numpy(), mu=mu)
    assert torch.allclose(plain.sigmas[:-1], shifted, rtol=1e-6, atol=0)


def test_trainer_steps_shift_their_noise_levels_as_the_pipeline_would(demo_folder, tiny_cache):
    """Two runs with one seed, resolution shift on and off: each step's timestep with the shift equals the
    scheduler's time_shift of the one without, at the pipeline's mu for the tokens the transformer saw."""
    seen = {}
    for shift in (False, True):
        components = build_tiny_components(storage="float32")
        trainer = Trainer(components, cached_demo(components, demo_folder, tiny_cache), LoraConfig(rank=2),
                          OptimizerConfig(learning_rate=1e-3),
                          TrainConfig(run_name="shift", resolution_shift=shift, timestep_sampling="logit_normal"))
        calls = seen[shift] = []
        trainer.built.transformer.register_forward_pre_hook(
            lambda _m, _args, kw: calls.append((kw["hidden_states"].shape[1], kw["timestep"].clone())), with_kwargs=True)
        trainer.train(4)
    scheduler = qwen_scheduler()
    assert len(seen[True]) == len(seen[False]) == 4
    for (tokens, shifted), (tokens_off, unshifted) in zip(seen[True], seen[False]):
        assert tokens == tokens_off and shifted.dtype == torch.float32
        assert not torch.equal(shifted, unshifted)
        assert torch.equal(shifted, scheduler.time_shift(pipeline_mu(tokens, scheduler), 1.0, unshifted))


# ====================================================================================================
# one training step's loss against the text-to-image pipeline's own pieces


def text_to_image_reference(components, sample, seed: int):
    """One training step's loss from `QwenImagePipeline`'s own pieces: `encode_prompt` (embeddings and the mask
    it drops when nothing is padded), `prepare_latents` (the noise, drawn as the pipeline draws it, and packed),
    `_pack_latents`, mu from `calculate_shift` at the packed token count, the scheduler's `time_shift`, and
    `img_shapes` and the transformer's keyword arguments as `__call__` makes them. The target's latents are
    the VAE's distribution mode normalised by its config (diffusers' `_encode_vae_image` of the Edit pipeline;
    the text-to-image pipeline encodes no images). Returns (loss, what the transformer was handed, the level
    before its shift)."""
    from types import SimpleNamespace

    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline, QwenImagePipeline
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    from trainer_core.data.images import load_cropped
    from trainer_core.models.text import template_prefix_length

    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config),
                             vae=components.vae, text_encoder=components.text_encoder,
                             tokenizer=components.tokenizer, transformer=components.transformer)
    # The pipeline hard-codes the real tokenizer's 34 template tokens; test_models checks ours counts them.
    pipe.prompt_template_encode_start_idx = template_prefix_length(components.tokenizer)
    w, h = sample.bucket
    f = pipe.vae_scale_factor
    c = components.transformer.config.in_channels // 4  # as __call__ computes num_channels_latents
    prompt, mask = pipe.encode_prompt(sample.caption, device=torch.device("cpu"))
    pixels = load_cropped(sample.image_path, sample.bucket).unsqueeze(0).unsqueeze(2)  # (1, 3, 1, H, W)
    encoder = SimpleNamespace(vae=components.vae, latent_channels=c)  # the two attributes the method reads
    with torch.no_grad():
        x0 = pipe._pack_latents(QwenImageEditPipeline._encode_vae_image(encoder, pixels, None), 1, c, h // f, w // f)
    # The trainer's draws for its first micro-batch (training/randomness.py): the noise, and the noise level.
    noise = pipe.prepare_latents(1, c, h, w, torch.float32, torch.device("cpu"),
                                 randomness.generator(seed, 0, randomness.NOISE))  # (1, N, 4C), packed
    level = randomness.generator(seed, 0, randomness.NOISE_LEVELS)
    unshifted = torch.sigmoid(torch.randn(1, generator=level))  # logit-normal, mean 0, std 1 (the defaults)
    mu = calculate_shift(noise.shape[1], pipe.scheduler.config.get("base_image_seq_len", 256),
                         pipe.scheduler.config.get("max_image_seq_len", 4096),
                         pipe.scheduler.config.get("base_shift", 0.5), pipe.scheduler.config.get("max_shift", 1.15))
    s = pipe.scheduler.time_shift(mu, 1.0, unshifted)
    x_t = (1 - s) * x0 + s * noise
    inputs = dict(hidden_states=x_t, timestep=s, guidance=None, encoder_hidden_states_mask=mask,
                  encoder_hidden_states=prompt, img_shapes=[[(1, h // f // 2, w // f // 2)]], attention_kwargs={},
                  return_dict=False)
    with torch.no_grad():
        prediction = components.transformer(**inputs)[0]
    return float(torch.nn.functional.mse_loss(prediction.float(), (noise - x0).float())), inputs, unshifted


def test_one_training_step_loss_equals_the_reference_from_the_text_to_image_pipelines_pieces(tmp_path):
    """The trainer's first loss equals, bit for bit, the loss made above from the pipeline's pieces; and the
    pipeline's `__call__` itself, run for that one noise level, hands its transformer the same inputs (its
    timestep goes through the scheduler's numpy schedule and t * 1000 / 1000: equal up to float32 rounding)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    from conftest import tiny_dataset_config
    from trainer_core.data.cache import build_cache
    from trainer_core.data.images import discover
    from trainer_core.models.text import template_prefix_length

    Image.new("RGB", (192, 64), (200, 60, 40)).save(tmp_path / "a.png")
    (tmp_path / "a.txt").write_text("a red square on white")
    components = build_tiny_components(storage="float32")
    (sample,) = discover(tiny_dataset_config(tmp_path))
    assert sample.bucket == (96, 32)  # not square: a width and height mixed up would show
    expected, inputs, unshifted = text_to_image_reference(components, sample, seed=7)

    # __call__ with the reference's noisy latents as its starting latents and its unshifted level as its one
    # sigma (a schedule without the terminal stretch, an inference-only step that would move a lone sigma).
    config = {**components.scheduler_config, "shift_terminal": None}
    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_config(config), vae=components.vae,
                             text_encoder=components.text_encoder, tokenizer=components.tokenizer,
                             transformer=components.transformer)
    pipe.prompt_template_encode_start_idx = template_prefix_length(components.tokenizer)
    pipe.set_progress_bar_config(disable=True)
    w, h = sample.bucket
    _, called = first_call(components.transformer, lambda: pipe(
        prompt=sample.caption, width=w, height=h, sigmas=[float(unshifted)], latents=inputs["hidden_states"],
        true_cfg_scale=1.0, output_type="latent"))
    assert torch.equal(called["hidden_states"], inputs["hidden_states"])
    assert torch.equal(called["encoder_hidden_states"], inputs["encoder_hidden_states"])
    assert called["encoder_hidden_states_mask"] is None and inputs["encoder_hidden_states_mask"] is None
    assert called["img_shapes"] == inputs["img_shapes"] and called["guidance"] is None
    assert torch.allclose(called["timestep"], inputs["timestep"], rtol=1e-6, atol=0)

    loss = one_step_loss(components, build_cache(components, [sample], tmp_path / "cache"), "t2i")
    assert loss == expected  # the same operations on the same numbers (the adapter starts as a no-op)


# ====================================================================================================
# single-file loaders on save_pretrained output renamed to ComfyUI's layouts


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """The seed-0 tiny parts (fp32) written by diffusers' / transformers' own `save_pretrained`."""
    components = build_tiny_components(storage="float32")
    root = tmp_path_factory.mktemp("save_pretrained")
    components.transformer.save_pretrained(root / "transformer")
    components.text_encoder.save_pretrained(root / "text_encoder")
    components.vae.save_pretrained(root / "vae")
    return components, root


def read_pretrained(folder):
    """(tensors, config) of a `save_pretrained` folder with one safetensors file."""
    (weights,) = folder.glob("*.safetensors")
    return load_file(str(weights)), json.loads((folder / "config.json").read_text())


def write_single_file(tensors, path, part, config):
    """A single file plus the config JSON beside it that tiny models need ({"part", "config"})."""
    save_file(tensors, str(path))
    path.with_suffix(".json").write_text(json.dumps({"part": part, "config": config}))
    return path


def assert_parameters_equal(expected: dict[str, torch.Tensor], model):
    loaded = dict(model.named_parameters())
    assert sorted(loaded) == sorted(expected)
    for name, value in expected.items():
        assert loaded[name].dtype == value.dtype and torch.equal(loaded[name], value), name


BLOCK_LINEAR_WEIGHT = re.compile(r"transformer_blocks\.\d+\..+\.weight")


@pytest.mark.parametrize("prefix,fmt", [("", "fp32"), ("model.diffusion_model.", "fp32"),
                                        ("model.diffusion_model.", "fp8_e4m3fn")])
def test_transformer_file_from_save_pretrained_loads_every_weight(pretrained, tmp_path, prefix, fmt):
    from trainer_core.models.transformer_file import load_transformer_file

    components, root = pretrained
    tensors, config = read_pretrained(root / "transformer")
    original = dict(components.transformer.named_parameters())
    assert sorted(tensors) == sorted(original)  # diffusers' names are the file's names
    if fmt == "fp8_e4m3fn":  # ComfyUI's fp8 file: block Linear weights float8, the rest bf16
        tensors = {k: v.to(FLOAT8 if BLOCK_LINEAR_WEIGHT.fullmatch(k) and v.ndim == 2 else torch.bfloat16)
                   for k, v in tensors.items()}
    path = write_single_file({prefix + k: v for k, v in tensors.items()}, tmp_path / "qwen_image.safetensors",
                             "transformer", config)
    loaded = load_transformer_file(path, storage="float32" if fmt == "fp32" else "float8", compute_dtype=torch.float32)
    assert json.loads(json.dumps({k: loaded.config[k] for k in config if not k.startswith("_")})) == \
        {k: v for k, v in config.items() if not k.startswith("_")}
    if fmt == "fp32":
        assert_parameters_equal(original, loaded)
        return
    params = dict(loaded.named_parameters())
    assert sorted(params) == sorted(original)
    for name, value in original.items():
        if tensors[name].dtype == FLOAT8:  # kept as stored, byte for byte: the original's float8 rounding
            assert params[name].dtype == FLOAT8, name
            assert torch.equal(params[name].view(torch.uint8), value.to(FLOAT8).view(torch.uint8)), name
        else:
            assert torch.equal(params[name], value.to(torch.bfloat16).float()), name
    assert sum(t.dtype == FLOAT8 for t in tensors.values()) == 2 * 14


def comfyui_text_encoder_name(hf_name: str) -> str:
    """ComfyUI's text_encoders/qwen_2.5_vl_7b*.safetensors names (comfy/text_encoders/llama.py, qwen_vl.py):
    the language model under `model.`, the vision tower under `visual.`, and `lm_head.weight`. (transformers
    5's `save_pretrained` already writes Qwen2.5-VL's original checkpoint names, which are these; its
    in-memory names `model.language_model.*` / `model.visual.*` map here too.)"""
    for ours, comfy in (("model.language_model.", "model."), ("model.visual.", "visual."),
                        ("model.", "model."), ("visual.", "visual."), ("lm_head.", "lm_head.")):
        if hf_name.startswith(ours):
            return comfy + hf_name[len(ours):]
    raise AssertionError(f"unexpected text encoder tensor {hf_name}")


def transformers5_text_encoder_name(comfy_name: str) -> str:
    """The names of transformers 5's `Qwen2_5_VLForConditionalGeneration` modules, from ComfyUI's."""
    for comfy, ours in (("model.", "model.language_model."), ("visual.", "model.visual.")):
        if comfy_name.startswith(comfy):
            return ours + comfy_name[len(comfy):]
    return comfy_name


def scaled_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ComfyUI's scaled fp8 (comfy/ops.py): stored = weight / scale in e4m3fn, scale = amax / 448."""
    scale = (weight.abs().max().float() / torch.finfo(FLOAT8).max).reshape(())
    return (weight.float() / scale).to(FLOAT8), scale


@pytest.mark.parametrize("layout,fmt", [("comfyui", "fp32"), ("comfyui", "fp8_scaled"), ("transformers5", "fp32")])
def test_text_encoder_file_from_save_pretrained_loads_every_language_model_weight(pretrained, tmp_path, layout, fmt):
    from trainer_core.models.text_encoder_file import load_text_encoder_file

    components, root = pretrained
    hf, config = read_pretrained(root / "text_encoder")
    tensors = {comfyui_text_encoder_name(k): v for k, v in hf.items()}
    assert {"model.embed_tokens.weight", "model.layers.1.self_attn.q_proj.bias", "model.norm.weight",
            "lm_head.weight"} <= set(tensors) and any(k.startswith("visual.blocks.0.") for k in tensors)
    expected = {n: p for n, p in components.text_encoder.named_parameters() if n.startswith("model.language_model.")}
    assert len(expected) == 2 * 12 + 2  # per layer 7 Linear weights, 3 biases, 2 norms; embeddings, final norm
    if fmt == "fp8_scaled":  # every Linear weight (language model and vision tower), as ComfyUI's file
        for key in [k for k, v in tensors.items() if v.ndim == 2 and not k.endswith(("embed_tokens.weight", "lm_head.weight"))]:
            tensors[key], tensors[key.removesuffix("weight") + "scale_weight"] = scaled_fp8(tensors[key])
        tensors["scaled_fp8"] = torch.tensor([], dtype=FLOAT8)
        for name in expected:
            stored = tensors[comfyui_text_encoder_name(name)]
            if stored.dtype == FLOAT8:  # the file's own arithmetic: stored * scale_weight
                expected[name] = stored.float() * tensors[comfyui_text_encoder_name(name).removesuffix("weight") + "scale_weight"]
        assert sum(v.dtype == FLOAT8 for v in expected.values()) == 0 and sum(
            tensors[comfyui_text_encoder_name(n)].dtype == FLOAT8 for n in expected) == 2 * 7
    if layout == "transformers5":
        tensors = {transformers5_text_encoder_name(k): v for k, v in tensors.items()}
    path = write_single_file(tensors, tmp_path / "qwen_2.5_vl.safetensors", "text encoder", config)
    loaded = load_text_encoder_file(path, compute_dtype=torch.float32)
    assert_parameters_equal(expected, loaded)  # the vision tower and lm_head are not loaded, by design


def wan_vae_name(name: str, num_res_blocks: int) -> str:
    """The Wan 2.1 VAE name (Wan2.1 wan/modules/vae.py, ComfyUI comfy/ldm/wan/vae.py) of a diffusers
    `AutoencoderKLQwenImage` tensor, from Wan's module structure:
      WanVAE: conv1 (before the latent split) = quant_conv, conv2 = post_quant_conv;
      Encoder3d / Decoder3d: conv1, then `downsamples` / `upsamples` (flat Sequentials), middle =
        Sequential(ResidualBlock, AttentionBlock, ResidualBlock), head = Sequential(RMS_norm, SiLU, conv);
      the decoder's `upsamples` per level: num_res_blocks + 1 ResidualBlocks, then a Resample (none after
        the last level); the encoder's `downsamples` hold the same sequence as diffusers' down_blocks;
      ResidualBlock: residual = Sequential(RMS_norm, SiLU, conv, RMS_norm, SiLU, Dropout, conv), shortcut;
      Resample: resample = Sequential(pad or upsample, conv), time_conv; AttentionBlock: norm, to_qkv, proj.
    """
    residual = {"norm1": "residual.0", "conv1": "residual.2", "norm2": "residual.3", "conv2": "residual.6",
                "conv_shortcut": "shortcut"}

    def block(inner: str) -> str:
        first, _, rest = inner.partition(".")
        return f"{residual.get(first, first)}.{rest}"

    rules = [
        (r"quant_conv\.(.+)", lambda m: f"conv1.{m[1]}"),
        (r"post_quant_conv\.(.+)", lambda m: f"conv2.{m[1]}"),
        (r"(encoder|decoder)\.conv_in\.(.+)", lambda m: f"{m[1]}.conv1.{m[2]}"),
        (r"(encoder|decoder)\.norm_out\.(.+)", lambda m: f"{m[1]}.head.0.{m[2]}"),
        (r"(encoder|decoder)\.conv_out\.(.+)", lambda m: f"{m[1]}.head.2.{m[2]}"),
        (r"(encoder|decoder)\.mid_block\.resnets\.([01])\.(.+)", lambda m: f"{m[1]}.middle.{2 * int(m[2])}.{block(m[3])}"),
        (r"(encoder|decoder)\.mid_block\.attentions\.0\.(.+)", lambda m: f"{m[1]}.middle.1.{m[2]}"),
        (r"encoder\.down_blocks\.(\d+)\.(.+)", lambda m: f"encoder.downsamples.{m[1]}.{block(m[2])}"),
        (r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.+)",
         lambda m: f"decoder.upsamples.{int(m[1]) * (num_res_blocks + 2) + int(m[2])}.{block(m[3])}"),
        (r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.+)",
         lambda m: f"decoder.upsamples.{int(m[1]) * (num_res_blocks + 2) + num_res_blocks + 1}.{m[2]}"),
    ]
    for pattern, rename in rules:
        if m := re.fullmatch(pattern, name):
            return rename(m)
    raise AssertionError(f"no Wan name for {name}")


# The real VAE's structure (four levels, two residual blocks, temporal downsampling twice) at a tiny width,
# where diffusers' own Wan converter (written for the real structure only) can check the names above.
REAL_STRUCTURE_VAE = dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                          temperal_downsample=[False, True, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4)


@pytest.mark.parametrize("structure", ["tiny", "real"])
def test_wan_layout_vae_file_from_save_pretrained_loads_every_weight(pretrained, tmp_path, structure):
    from diffusers import AutoencoderKLQwenImage
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    from trainer_core.models.vae_file import load_vae_file

    if structure == "tiny":
        vae, root = pretrained[0].vae, pretrained[1]
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(5)
            vae = AutoencoderKLQwenImage(**REAL_STRUCTURE_VAE).eval()
        root = tmp_path
        vae.save_pretrained(root / "vae")
    tensors, config = read_pretrained(root / "vae")
    wan = {wan_vae_name(k, config["num_res_blocks"]): v for k, v in tensors.items()}
    assert len(wan) == len(tensors)
    assert {"decoder.middle.0.residual.0.gamma", "encoder.downsamples.0.residual.2.weight", "conv1.weight",
            "conv2.weight", "decoder.head.2.bias", "encoder.middle.1.to_qkv.weight"} <= set(wan)
    if structure == "real":  # diffusers maps the Wan names back to exactly its own tensors
        back = convert_wan_vae_to_diffusers(dict(wan))
        assert sorted(back) == sorted(tensors) and all(torch.equal(back[k], tensors[k]) for k in tensors)
    path = write_single_file(wan, tmp_path / "qwen_image_vae.safetensors", "vae", config)
    loaded = load_vae_file(path, compute_dtype=torch.float32)
    assert_parameters_equal(dict(vae.named_parameters()), loaded)
