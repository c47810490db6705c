"""Qwen-Image 2.1 as a model family (trainer_core/families/qwen_image21/), against oracles we did not write:
the pinned `QwenImage21Pipeline`'s own pieces and `__call__`, and diffusers' converter of ComfyUI's 2.1 files.

- One training step's loss equals, bit for bit, the loss rebuilt from the pipeline's pieces (`encode_prompt`,
  `_encode_vae_image`, `_pack_latents`, `prepare_latents`, `calculate_shift`, the scheduler's `time_shift`,
  the image-slot mask and `img_shapes` as `__call__` builds them); `__call__` hands its transformer the same.
- ComfyUI-layout transformer files (MLP fused as `img_mlp.gate_up` or split; bf16 or float8) load to the
  weights diffusers' `convert_qwen_image21_transformer_checkpoint_to_diffusers` makes of them.
- LoRA targets are 2.1's own Linears; a training run through the block runner (a streamed block, float8
  storage, checkpointing) trains.
"""

import pytest
import torch
from PIL import Image

from conftest import first_call, one_step_loss

from trainer_core.core.config import LoraConfig
from trainer_core.families import get_family
from trainer_core.training import randomness

FAMILY = "qwen-image-2.1"


@pytest.fixture(scope="module")
def tiny21():
    return get_family(FAMILY).tiny_components(storage="float32")


def one_image(folder, size=(192, 64)):
    """One not-square image (a width/height mix-up would show) and its caption."""
    Image.new("RGB", size, (200, 60, 40)).save(folder / "a.png")
    (folder / "a.txt").write_text("a red square on white")
    from conftest import tiny_dataset_config
    from trainer_core.data.images import discover

    (sample,) = discover(tiny_dataset_config(folder))
    return sample


def pipeline(components, scheduler_config=None):
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline

    scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler_config or components.scheduler_config)
    pipe = QwenImage21Pipeline(scheduler=scheduler, vae=components.vae, text_encoder=components.text_encoder,
                               processor=components.tokenizer, transformer=components.transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def noisy_latents(pipe, seed, x0, noise):
    """(the noise level before its shift, the shifted level s, x_t = (1 - s) x0 + s noise) as the training step draws
    the level for micro-batch 0 of `seed`, shifted with the pipeline's own mu (`calculate_shift` over the image tokens
    of `noise`, (1, N, C)) and its scheduler's `time_shift`."""
    from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_shift

    unshifted = torch.sigmoid(torch.randn(1, generator=randomness.generator(seed, 0, randomness.NOISE_LEVELS)))
    config = pipe.scheduler.config
    mu = calculate_shift(noise.shape[1], config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                         config.get("base_shift", 0.5), config.get("max_shift", 1.15))
    s = pipe.scheduler.time_shift(mu, 1.0, unshifted)
    return unshifted, s, (1 - s) * x0 + s * noise


def reference_loss(components, sample, seed):
    """(loss, the transformer's inputs, the level before its shift) from the pipeline's pieces."""
    from trainer_core.data.images import load_cropped

    pipe = pipeline(components)
    w, h = sample.bucket
    f = pipe.vae_scale_factor
    c = components.transformer.config.in_channels  # patch 1: __call__'s num_channels_latents
    cpu = torch.device("cpu")
    prompt, mask, slots = pipe.encode_prompt(sample.caption, device=cpu)
    rgb = load_cropped(sample.image_path, sample.bucket)  # (3, H, W) in [-1, 1]
    # The pipeline's own image preprocessing (convert("RGBA"), then its VaeImageProcessor) of the crop.
    crop = Image.fromarray(((rgb.permute(1, 2, 0) + 1) * 127.5).round().to(torch.uint8).numpy())
    rgba = pipe.image_processor.preprocess(crop.convert("RGBA"), width=w, height=h)  # (1, 4, H, W)
    assert torch.equal(rgba[0, :3], rgb) and bool((rgba[0, 3] == 1).all())  # opaque: alpha 1, as we encode
    with torch.no_grad():
        latents = pipe._encode_vae_image(rgba.unsqueeze(2), None)  # (1, C, 1, h, w), normalised
    x0 = pipe._pack_latents(latents, 1, c, h // f, w // f)  # (1, N, C)
    noise, _ = pipe.prepare_latents(None, 1, c, h, w, torch.float32, cpu,
                                    randomness.generator(seed, 0, randomness.NOISE))
    unshifted, s, x_t = noisy_latents(pipe, seed, x0, noise)
    img_mask = torch.cat([slots, slots.new_ones(1, noise.shape[1] // 4)], dim=1)  # __call__'s append_target_slots
    inputs = dict(hidden_states=x_t, timestep=s, encoder_hidden_states=prompt, encoder_hidden_states_mask=mask,
                  img_shapes=[[(1, h // f, w // f)]], img_mask=img_mask, return_dict=False)
    with torch.no_grad():
        prediction = components.transformer(**inputs)[0][:, -noise.shape[1]:]
    return float(torch.nn.functional.mse_loss(prediction.float(), (noise - x0).float())), inputs, unshifted


def test_one_training_step_loss_equals_the_reference_from_the_pipelines_pieces(tiny21, tmp_path):
    from trainer_core.data.cache import build_cache

    components = tiny21
    sample = one_image(tmp_path)
    assert sample.bucket == (96, 32)
    expected, inputs, unshifted = reference_loss(components, sample, seed=7)

    # __call__ with the reference's noisy latents and its unshifted level as its one sigma hands its
    # transformer the same inputs (timestep through t * 1000 / 1000: float32 rounding).
    pipe = pipeline(components, {**components.scheduler_config, "shift_terminal": None})
    w, h = sample.bucket
    _, called = first_call(components.transformer, lambda: pipe(
        prompt=sample.caption, width=w, height=h, sigmas=[float(unshifted)], latents=inputs["hidden_states"],
        output_type="latent", use_kv_cache=False))
    for name in ("hidden_states", "encoder_hidden_states", "img_mask"):
        assert torch.equal(called[name], inputs[name]), name
    assert called["encoder_hidden_states_mask"] is None and inputs["encoder_hidden_states_mask"] is None
    assert called["img_shapes"] == inputs["img_shapes"]
    assert torch.allclose(called["timestep"], inputs["timestep"], rtol=1e-6, atol=0)

    loss = one_step_loss(components, build_cache(components, [sample], tmp_path / "cache"), "q21")
    assert loss == expected  # the same operations on the same numbers (the adapter starts as a no-op)


def test_lora_targets_are_the_single_stream_blocks_linears(tiny21):
    from trainer_core.adapters.lora import target_module_names

    transformer = tiny21.transformer
    names = target_module_names(transformer, "all")
    assert len(names) == 7 * len(transformer.transformer_blocks)
    modules = dict(transformer.named_modules())
    assert all(isinstance(modules[n], torch.nn.Linear) for n in names)
    assert {n.split(".", 2)[2] for n in target_module_names(transformer, "attention")} == {
        "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0"}


@pytest.mark.parametrize("fmt,mlp", [("bf16", "fused"), ("bf16", "split"), ("fp8_e4m3fn_scaled", "fused"),
                                     ("fp8_e4m3fn", "split")])
def test_comfyui_transformer_files_load_to_what_diffusers_converter_makes_of_them(tiny21, tmp_path, fmt, mlp):
    """Our reader of a ComfyUI-layout file (either MLP layout) against diffusers' own converter of the same
    file (`convert_qwen_image21_transformer_checkpoint_to_diffusers`, scaled float8 dequantised first)."""
    import json

    from diffusers.loaders.single_file_utils import convert_qwen_image21_transformer_checkpoint_to_diffusers
    from safetensors.torch import load_file, save_file

    from trainer_core.families.qwen_image21.files import QwenImage21TransformerFile, comfyui_transformer_tensors
    from trainer_core.models.float8 import dequantized_state_dict

    path = tmp_path / "qwen_image21.safetensors"
    save_file(comfyui_transformer_tensors(tiny21.transformer, fmt, mlp), str(path))
    config = dict(tiny21.transformer.config)
    path.with_suffix(".json").write_text(json.dumps({"part": "transformer", "config": {
        "axes_dims_rope": list(config["axes_dims_rope"]), "causal_condition": config["causal_condition"]}}))
    raw = load_file(str(path))
    assert any(k.endswith("img_mlp.gate_up.weight") for k in raw) == (mlp == "fused")
    for key in [k for k in raw if k.endswith(".scale_weight")]:  # ComfyUI's scaled float8: weight * scale
        weight = key.removesuffix(".scale_weight") + ".weight"
        raw[weight] = raw[weight].float() * raw.pop(key)
    raw.pop("model.diffusion_model.scaled_fp8", None)
    theirs = convert_qwen_image21_transformer_checkpoint_to_diffusers(raw)

    source = QwenImage21TransformerFile(path, storage="float32", compute_dtype=torch.float32)
    assert source.mlp_layout == mlp
    ours = dequantized_state_dict(source.load())
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor.float()), name


def test_a_fused_mlp_half_holds_only_its_own_rows(tiny21, tmp_path):
    """Float8 blocks from a float8 file are stored as read: each half of a fused `gate_up` must be a copy of its
    rows, not a view that keeps the whole fused tensor alive (3 GiB more at the real size, the CPU rehearsal
    found)."""
    import json

    from safetensors.torch import save_file

    from trainer_core.families.qwen_image21.files import QwenImage21TransformerFile, comfyui_transformer_tensors

    path = tmp_path / "qwen_image21.safetensors"
    save_file(comfyui_transformer_tensors(tiny21.transformer, "fp8_e4m3fn", "fused"), str(path))
    config = dict(tiny21.transformer.config)
    path.with_suffix(".json").write_text(json.dumps({"part": "transformer", "config": {
        "axes_dims_rope": list(config["axes_dims_rope"]), "causal_condition": config["causal_condition"]}}))
    model = QwenImage21TransformerFile(path, storage="float8", compute_dtype=torch.float32).load()
    halves = [n for n in dict(model.named_parameters()) if ".img_mlp.gate_layer." in n or ".img_mlp.proj." in n]
    assert halves
    for name, p in model.named_parameters():
        assert p.untyped_storage().nbytes() == p.numel() * p.element_size(), name


@pytest.fixture(scope="module")
def with_lora():
    """A fresh tiny 2.1 with a rank-2 LoRA on every block Linear, its B random (not a no-op), alpha 3."""
    from trainer_core.adapters.lora import inject_lora, lora_layers

    components = get_family(FAMILY).tiny_components(storage="float32")
    inject_lora(components.transformer, LoraConfig(rank=2, alpha=3.0, targets="all"), seed=3)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in lora_layers(components.transformer).values():
            b = layer.lora_B["default"].weight
            b.copy_(torch.randn(b.shape, generator=generator) * 0.1)
    return components


def forward_output(transformer):
    """The tiny transformer's output on fixed inputs (a 4 x 6 latent grid after 5 text rows)."""
    from trainer_core.families.qwen_image21.objective import transformer_kwargs

    generator = torch.Generator().manual_seed(11)
    hidden = torch.randn(1, 24, transformer.config.in_channels, generator=generator)
    text = torch.randn(1, 5, transformer.config.context_in_dim, generator=generator)
    with torch.no_grad():
        return transformer(**transformer_kwargs(hidden, (4, 6), text, None), timestep=torch.tensor([0.6]),
                           return_dict=False)[0]


@pytest.mark.parametrize("layout", ["diffusers", "comfyui"])
def test_a_lora_file_loads_into_the_pipeline_with_every_key_used_and_the_same_output(with_lora, tmp_path, layout):
    """diffusers' own Qwen loader reads both layouts Save writes for 2.1 (diffusers': `transformer.` names, alpha
    folded; comfyui: bare names with `.alpha`): every module loaded, the transformer's output that of our adapter."""
    from diffusers import QwenImage21Pipeline
    from peft.tuners.lora import LoraLayer
    from safetensors.torch import save_file

    from test_qwen_image21_comfy_keys import modules_of
    from trainer_core.adapters.lora_files import lora_file_tensors

    tensors = lora_file_tensors(with_lora.transformer, rank=2, alpha=3.0, dtype=torch.float32, layout=layout)
    save_file(tensors, str(tmp_path / "lora.safetensors"))
    fresh = get_family(FAMILY).tiny_components(storage="float32")
    pipe = QwenImage21Pipeline(scheduler=None, vae=fresh.vae, text_encoder=None, processor=fresh.tokenizer,
                               transformer=fresh.transformer)
    pipe.load_lora_weights(str(tmp_path / "lora.safetensors"))
    loaded = {n for n, m in fresh.transformer.named_modules() if isinstance(m, LoraLayer)}
    assert loaded == modules_of(k.removeprefix("transformer.") for k in tensors)  # every key used
    torch.testing.assert_close(forward_output(fresh.transformer), forward_output(with_lora.transformer),
                               rtol=1e-5, atol=1e-6)


def test_comfyui_layout_reads_back_and_a_fused_gate_up_file_reads_as_the_two_halves(with_lora, tmp_path):
    """Our comfyui-layout 2.1 file (bare names, the MLP pair on its own names: test_qwen_image21_comfy_keys.py)
    reads back to the trained pairs; so does a file holding each pair as one rank-2r LoRA on ComfyUI's fused
    `gate_up` (stacked A, block-diagonal B, alpha doubled: another trainer's, or ours before), built here."""
    from safetensors.torch import save_file

    from trainer_core.adapters.lora import adapter_weights
    from trainer_core.adapters.lora_files import lora_file_tensors
    from trainer_core.adapters.lora_reading import read_lora_file

    trained = adapter_weights(with_lora.transformer)
    tensors = lora_file_tensors(with_lora.transformer, rank=2, alpha=3.0, dtype=torch.float32, layout="comfyui")
    assert not any(k.startswith("diffusion_model.") or ".gate_up." in k for k in tensors)
    fused = {}
    for name, (a, b) in trained.items():
        if name.endswith("img_mlp.proj"):
            continue
        if name.endswith("img_mlp.gate_layer"):
            a_p, b_p = trained[name.replace("gate_layer", "proj")]
            a, b, alpha = torch.cat([a, a_p]), torch.block_diag(b, b_p), 6.0
            name = name.replace("gate_layer", "gate_up")
        else:
            alpha = 3.0
        fused |= {f"diffusion_model.{name}.lora_A.weight": a.contiguous(),
                  f"diffusion_model.{name}.lora_B.weight": b.contiguous(),
                  f"diffusion_model.{name}.alpha": torch.tensor(alpha)}
    for file, what in ((tensors, "ours"), (fused, "fused")):
        save_file(file, str(tmp_path / f"{what}.safetensors"))
        back = read_lora_file(tmp_path / f"{what}.safetensors", model=with_lora.transformer)
        assert back.rank == 2 and back.alpha == 3.0 and sorted(back.weights) == sorted(trained), what
        for name, (a, b) in trained.items():
            assert torch.equal(back.weights[name][0], a.float()) and torch.equal(back.weights[name][1], b.float()), name


@pytest.mark.parametrize("layout", ["comfyui", "diffusers", "kohya"])
def test_a_run_continues_from_its_own_lora_in_every_layout(with_lora, tiny21, tmp_path, layout):
    """continue_from_lora reads a 2.1 LoRA back in each layout: the two Save writes, and kohya's as other trainers
    write it (issue 45: kohya's names were read by Qwen-Image's block names only, so a 2.1 kohya file 'adapts modules
    that this model does not have')."""
    from safetensors.torch import save_file

    from trainer_core.adapters.lora import adapter_weights
    from trainer_core.adapters.lora_files import layout_metadata, lora_file_tensors, lora_metadata
    from trainer_core.core.config import OptimizerConfig, TrainConfig
    from trainer_core.data.cache import build_cache
    from trainer_core.training import Trainer

    trained = adapter_weights(with_lora.transformer)
    path = tmp_path / f"{layout}.safetensors"
    if layout == "kohya":  # another trainer's 2.1 kohya file: Save refuses the layout for 2.1 (it misses fused files)
        from test_qwen_image21_comfy_keys import as_kohya

        tensors = as_kohya(lora_file_tensors(with_lora.transformer, rank=2, alpha=3.0, dtype=torch.float32))
    else:
        tensors = lora_file_tensors(with_lora.transformer, rank=2, alpha=3.0, dtype=torch.float32, layout=layout)
    metadata = lora_metadata(LoraConfig(rank=2, alpha=3.0, targets="all"), 0, "tiny 2.1", layout_metadata(layout, 2, 3.0))
    save_file(tensors, str(path), metadata=metadata)  # what Save writes
    cached = build_cache(tiny21, [one_image(tmp_path)], tmp_path / "cache")
    trainer = Trainer(tiny21, cached, LoraConfig(), OptimizerConfig(optimizer="adamw"), TrainConfig(run_name="on"),
                      init_lora=path)
    try:
        assert trainer.decided.lora.rank == 2 and trainer.decided.lora.alpha == 3.0
        continued = adapter_weights(trainer.built.transformer)
        assert sorted(continued) == sorted(trained)
        for name, (a, b) in trained.items():
            torch.testing.assert_close(continued[name][0], a, rtol=0, atol=0)
            torch.testing.assert_close(continued[name][1], b, rtol=1e-6, atol=1e-7)  # diffusers: B * alpha / rank
    finally:
        trainer.close()


def test_export_tiny_files_and_folder_load_back_to_the_tiny_model(tiny21, tmp_path):
    """`export-tiny --model qwen-image-2.1`: the diffusers folder (alone, or beside a ComfyUI transformer file
    with the MLP fused or split) loads to the same weights and the same prompt embedding. Beside a transformer
    file the set is lazy: nothing but headers read until a part is needed."""
    from trainer_core.families import get_family
    from trainer_core.families.qwen_image21.folder import load_qwen_image21_folder
    from trainer_core.families.qwen_image21.text import encode_prompt
    from trainer_core.models.float8 import dequantized_state_dict

    written = get_family("qwen-image-2.1").export_tiny(tmp_path, layout="comfyui")
    expected = dequantized_state_dict(tiny21.transformer)
    for transformer_file in (None, written["transformer_bf16"], written["transformer_bf16_split_mlp"]):
        loaded = load_qwen_image21_folder(written["diffusers_folder"], transformer_file, storage="float32",
                                          compute_dtype=torch.float32)
        assert loaded.family.name == FAMILY
        if transformer_file is not None:
            assert loaded.transformer is None and loaded.text_encoder is None and loaded.num_blocks == 2
            loaded.ensure_text_encoder()
        ours = dequantized_state_dict(loaded.ensure_transformer())
        assert sorted(ours) == sorted(expected)
        rounding = torch.bfloat16 if transformer_file is not None else torch.float32  # the file is bf16
        for name, tensor in expected.items():
            assert torch.equal(ours[name], tensor.to(rounding).float()), name
    tiny21.ensure_text_encoder()  # an earlier cache build released it
    assert torch.equal(encode_prompt(loaded.text_encoder, loaded.tokenizer, "a red circle"),
                       encode_prompt(tiny21.text_encoder, tiny21.tokenizer, "a red circle"))


def test_preview_equals_the_pipelines_own_sampling_from_its_prompt(tiny21, tmp_path):
    """The preview (cached embedding, our sampler's call of the family's pipeline) equals `QwenImage21Pipeline`
    run from the prompt itself with the same seed, size and steps (fp32, tiny)."""
    import numpy as np

    from trainer_core.data.cache import build_cache
    from trainer_core.families.sampling import sample_image

    prompt = "a red circle on a white background"
    cached = build_cache(tiny21, [one_image(tmp_path)], tmp_path / "cache", preview_prompts=[prompt])
    ours = sample_image(tiny21, cached, prompt, width=64, height=96, steps=2, cfg_scale=1.0, seed=3)
    assert tiny21.text_encoder is None  # the preview ran without the encoder (caching released it)
    tiny21.ensure_text_encoder()  # for the pipeline's own encoding of the prompt
    theirs = pipeline(tiny21)(prompt=prompt, width=64, height=96, num_inference_steps=2,
                              generator=torch.Generator("cpu").manual_seed(3)).images[0]
    assert ours.size == (64, 96) and np.array_equal(np.asarray(ours), np.asarray(theirs))
    assert ours.mode == theirs.mode == "RGBA"  # the RGBA VAE's decode, alpha kept (a headless preview's PNG holds it)
