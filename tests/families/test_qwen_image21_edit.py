"""Qwen-Image 2.1 reference-image editing (families/qwen_image21/ with an Edit dataset), against the pinned
`QwenImage21Pipeline`: its pieces for the loss, its `__call__` for what the transformer is handed and for previews.

- One training step's loss on a sample with a reference image equals, bit for bit, the loss rebuilt from the
  pipeline's pieces: step 1 of `__call__` (its `calculate_dimensions`, the RGBA copy, `image_processor.resize` and
  `preprocess`), `encode_prompt` with the image (vision tokens, image slots), `prepare_latents` (the reference's
  latents and the noise), `calculate_shift` and the scheduler's `time_shift`; `__call__` with that image hands its
  transformer the same inputs (reference tokens first, their `img_shapes`, the prompt's slots in `img_mask`).
- Cache keys of prompts and reference latents follow the reference image's bytes.
- Previews with the reference (cached, or given now), with a LoRA and with true CFG, equal `__call__` run from the
  prompt and the image itself (fp32, tiny).
"""

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from conftest import first_call, one_step_loss
from test_qwen_image21 import noisy_latents, pipeline

from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.families import get_family
from trainer_core.training import Trainer, randomness

FAMILY = "qwen-image-2.1"
RESOLUTION = 288  # references sized to 288² px of area: small, yet over the 256² px Qwen3-VL's processor enlarges to


@pytest.fixture(scope="module")
def tiny21():
    return get_family(FAMILY).tiny_components(storage="float32")


def reference_picture(size=(320, 200), colour=(40, 70, 220)) -> Image.Image:
    img = Image.new("RGB", size, "white")
    ImageDraw.Draw(img).ellipse((60, 40, 200, 160), fill=colour)
    return img


def edit_dataset(folder, reference: Image.Image | None = None, resolution: int = RESOLUTION, more=(),
                 target: Image.Image | None = None, **settings):
    """One not-square target (`target`, or a red 192 x 64 picture) with its caption and one reference beside it
    (name_control.png), and `more` references after it (name_control_2.png, ...); `settings`: DatasetConfig's."""
    from conftest import tiny_dataset_config
    from trainer_core.core.config import EditDataConfig
    from trainer_core.data.edit_dataset import load_edit_dataset

    folder.mkdir(parents=True, exist_ok=True)
    (target or Image.new("RGB", (192, 64), (200, 60, 40))).save(folder / "a.png")
    (folder / "a.txt").write_text("paint the circle red")
    (reference or reference_picture()).save(folder / "a_control.png")
    for n, picture in enumerate(more, start=2):
        picture.save(folder / f"a_control_{n}.png")
    return load_edit_dataset(tiny_dataset_config(folder, **settings), EditDataConfig(control_resolution=resolution))


def reference_loss(components, sample, references: list[Image.Image], seed, target: Image.Image | None = None):
    """(loss, the transformer's inputs, the level before its shift, x_t) from the pipeline's pieces. `target`: the
    target picture as it is (RGBA kept), of the bucket's aspect, for the pipeline's own resize; None: the RGB crop."""
    from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_dimensions

    from trainer_core.data.images import load_cropped

    pipe = pipeline(components)
    w, h = sample.bucket
    f = pipe.vae_scale_factor
    c = components.transformer.config.in_channels
    cpu = torch.device("cpu")
    # __call__'s step 1 with output_resolution = RESOLUTION: one size for each encoder image and its VAE image
    sizes, encoder_images, vae_images = [], [], []
    for reference in references:
        rgba = reference.convert("RGBA")
        rw, rh, _ = calculate_dimensions(RESOLUTION * RESOLUTION, rgba.width / rgba.height)
        sizes.append((rw, rh))
        encoder_images.append(pipe.image_processor.resize(rgba, width=rw, height=rh))
        vae_images.append(pipe.image_processor.preprocess(rgba, width=rw, height=rh).unsqueeze(2))  # (1, 4, 1, rh, rw)
    prompt, mask, slots = pipe.encode_prompt(sample.caption, image=encoder_images, device=cpu)
    assert int(slots.sum()) == sum((rw // 32) * (rh // 32) for rw, rh in sizes)  # one per 2 x 2 latent cells
    if target is None:
        rgb = load_cropped(sample.image_path, sample.bucket)  # the target as the text-to-image oracle takes it
        target = Image.fromarray(((rgb.permute(1, 2, 0) + 1) * 127.5).round().to(torch.uint8).numpy())
    target = pipe.image_processor.preprocess(target.convert("RGBA"), width=w, height=h)  # (1, 4, H, W)
    with torch.no_grad():
        x0 = pipe._pack_latents(pipe._encode_vae_image(target.unsqueeze(2), None), 1, c, h // f, w // f)  # (1, N, C)
        noise, ref_tokens = pipe.prepare_latents(vae_images, 1, c, h, w, torch.float32, cpu,
                                                 randomness.generator(seed, 0, randomness.NOISE))
    unshifted, s, x_t = noisy_latents(pipe, seed, x0, noise)
    img_mask = torch.cat([slots, slots.new_ones(1, noise.shape[1] // 4)], dim=1)  # __call__'s append_target_slots
    inputs = dict(hidden_states=torch.cat([ref_tokens, x_t], dim=1), timestep=s, encoder_hidden_states=prompt,
                  encoder_hidden_states_mask=mask, img_shapes=[[*[(1, rh // f, rw // f) for rw, rh in sizes], (1, h // f, w // f)]],
                  img_mask=img_mask, return_dict=False)
    with torch.no_grad():
        prediction = components.transformer(**inputs)[0][:, -noise.shape[1]:]
    return float(torch.nn.functional.mse_loss(prediction.float(), (noise - x0).float())), inputs, unshifted, x_t


@pytest.mark.parametrize("count", [1, 2])
def test_one_training_step_with_reference_images_equals_the_reference_from_the_pipelines_pieces(tiny21, tmp_path,
                                                                                                 count):
    from trainer_core.data.cache import build_cache

    components = tiny21
    components.ensure_text_encoder()  # an earlier cache build released it
    references = [reference_picture(), reference_picture((300, 300), (40, 170, 60))][:count]
    dataset = edit_dataset(tmp_path / "d", references[0], more=references[1:])
    (sample,) = dataset.samples
    assert sample.bucket == (96, 32) and len(sample.controls) == count
    expected, inputs, unshifted, x_t = reference_loss(components, sample, references, seed=7)

    pipe = pipeline(components, {**components.scheduler_config, "shift_terminal": None})
    w, h = sample.bucket
    _, called = first_call(components.transformer, lambda: pipe(
        prompt=sample.caption, image=references, width=w, height=h, sigmas=[float(unshifted)], latents=x_t,
        output_type="latent", use_kv_cache=False, output_resolution=RESOLUTION))
    for name in ("hidden_states", "encoder_hidden_states", "img_mask"):
        assert torch.equal(called[name], inputs[name]), name
    assert called["encoder_hidden_states_mask"] is None and inputs["encoder_hidden_states_mask"] is None
    assert called["img_shapes"] == inputs["img_shapes"]
    assert torch.allclose(called["timestep"], inputs["timestep"], rtol=1e-6, atol=0)

    family = components.family
    cached = build_cache(components, list(dataset.samples), tmp_path / "cache",
                         settings=family.data_settings(dataset))
    (entry,) = cached.samples
    assert entry.condition_sizes == ((352, 224), (288, 288))[:count]
    assert family.dropped_text_key(cached, entry) == entry.empty_text_key  # caption dropout keeps the references
    width, height = family.planned_image_size(cached)  # the memory plan counts the references' tokens as rows
    assert width * height >= 96 * 32 + sum(w * h for w, h in entry.condition_sizes)
    loss, ours = first_call(components.transformer, lambda: one_step_loss(components, cached, "q21edit"))
    # ours: the step's own call, the pipeline's inputs bit for bit
    for name in ("hidden_states", "encoder_hidden_states", "img_mask", "timestep"):
        assert torch.equal(ours[name], inputs[name]), name
    assert ours["img_shapes"] == inputs["img_shapes"] and ours["encoder_hidden_states_mask"] is None
    assert loss == expected  # the same operations on the same numbers (the adapter starts as a no-op)


def transparent(picture: Image.Image) -> Image.Image:
    """`picture` with its white pixels fully transparent and a half-transparent band across its middle (RGBA)."""
    rgba = np.asarray(picture.convert("RGBA")).copy()  # (H, W, 4)
    rgba[(rgba[..., :3] == 255).all(-1), 3] = 0
    rgba[rgba.shape[0] // 2 - 4: rgba.shape[0] // 2 + 4, :, 3] //= 2
    return Image.fromarray(rgba, "RGBA")


def test_transparent_target_and_reference_train_as_the_pipelines_pieces_take_them(tiny21, tmp_path):
    """Transparency kept (the default for 2.1): the target is encoded from its RGBA picture as the pipeline's image
    processor and VAE encode it, the reference's alpha reaches the VAE and its picture over white the text encoder (the
    pipeline's own `__call__` with the RGBA reference is the oracle); one training step's loss is the pipeline pieces'.
    With transparency "flatten" the images are composited onto the background first, as for the other models, and
    cached under other keys."""
    from pathlib import Path

    from trainer_core.data.cache import build_cache
    from trainer_core.data.images import open_image

    components = tiny21
    components.ensure_text_encoder()  # an earlier cache build released it
    target = transparent(Image.new("RGB", (192, 64), "white"))
    ImageDraw.Draw(target).ellipse((60, 8, 132, 56), fill=(200, 60, 40, 255))
    reference = transparent(reference_picture())
    dataset = edit_dataset(tmp_path / "d", reference, target=target)
    (sample,) = dataset.samples
    assert sample.decode.startswith("alpha") and sample.controls[0].decode.startswith("alpha")
    expected, inputs, unshifted, x_t = reference_loss(components, sample, [reference], seed=7, target=target)

    pipe = pipeline(components, {**components.scheduler_config, "shift_terminal": None})
    alpha = pipe.image_processor.preprocess(target, width=96, height=32)[0, 3]  # (H, W) in [-1, 1]
    assert float(alpha.min()) == -1.0 and float(alpha.max()) == 1.0  # the oracle's target is transparent in places
    _, called = first_call(components.transformer, lambda: pipe(
        prompt=sample.caption, image=[reference], width=96, height=32, sigmas=[float(unshifted)], latents=x_t,
        output_type="latent", use_kv_cache=False, output_resolution=RESOLUTION))
    for name in ("hidden_states", "encoder_hidden_states", "img_mask"):
        assert torch.equal(called[name], inputs[name]), name

    family = components.family
    cached = build_cache(components, list(dataset.samples), tmp_path / "cache", settings=family.data_settings(dataset))
    loss, ours = first_call(components.transformer, lambda: one_step_loss(components, cached, "q21alpha"))
    for name in ("hidden_states", "encoder_hidden_states", "img_mask", "timestep"):
        assert torch.equal(ours[name], inputs[name]), name
    assert loss == expected

    components.ensure_text_encoder()
    flat = edit_dataset(tmp_path / "d", reference, target=target, transparency="flatten")
    flat_cache = build_cache(components, list(flat.samples), tmp_path / "cache", settings=family.data_settings(flat))
    (kept_entry,), (flat_entry,) = cached.samples, flat_cache.samples
    assert flat_entry.latent_key != kept_entry.latent_key and flat_entry.text_key != kept_entry.text_key
    assert flat_entry.condition_keys[0] != kept_entry.condition_keys[0]
    # the oracle of a flattened run: the pictures composited onto white as the other models' datasets decode them
    components.ensure_text_encoder()
    flat_expected, flat_inputs, _u, _x = reference_loss(
        components, flat.samples[0], [open_image(Path(flat.samples[0].controls[0].path))], seed=7)
    assert not torch.equal(flat_inputs["hidden_states"], inputs["hidden_states"])
    assert one_step_loss(components, flat_cache, "q21flat") == flat_expected


def test_cache_keys_follow_the_reference_images_bytes(tiny21, tmp_path):
    from trainer_core.families.qwen_image21.conditioning import Conditioning21

    def keys(folder, reference):
        (sample,) = edit_dataset(folder, reference).samples
        conditioning = Conditioning21(tiny21, [sample], RESOLUTION)
        return conditioning.text_key(sample.caption, sample), tuple(conditioning.condition_jobs(sample))

    first = keys(tmp_path / "a", reference_picture())
    assert keys(tmp_path / "b", reference_picture()) == first  # same bytes, another folder: the same entries
    other = keys(tmp_path / "c", reference_picture(colour=(40, 170, 60)))
    assert other[0] != first[0] and other[1] != first[1]
    text_only = Conditioning21(tiny21, [], 0).text_key("paint the circle red", None)
    assert text_only not in (first[0], other[0])


def test_a_reference_too_small_for_the_text_encoder_is_refused_by_name(tiny21, tmp_path):
    from trainer_core.core.errors import UserInputError
    from trainer_core.data.cache import build_cache

    dataset = edit_dataset(tmp_path / "d", resolution=128)
    with pytest.raises(UserInputError, match="a_control.png.*control_resolution"):
        build_cache(tiny21, list(dataset.samples), tmp_path / "cache", settings=dataset.edit)


def test_a_reference_of_an_aspect_the_image_processor_refuses_is_refused_by_name(tiny21, tmp_path):
    """2100 x 10 px (210:1) at control_resolution 0: sized to 14848 x 64 px, over the 200:1 transformers' Qwen2-VL
    image processor takes. Before: its raw ValueError ('absolute aspect ratio must be smaller than 200')."""
    from trainer_core.core.errors import UserInputError
    from trainer_core.data.cache import build_cache

    dataset = edit_dataset(tmp_path / "d", reference=Image.new("RGB", (2100, 10), "blue"), resolution=0)
    with pytest.raises(UserInputError, match=r"reference image a_control.png is 2100x10 px: Qwen3-VL's image processor "
                                             r"refuses it .* to 14848x64 px: absolute aspect ratio .* Crop it to an "
                                             r"aspect ratio under 200:1\."):
        build_cache(tiny21, list(dataset.samples), tmp_path / "cache", settings=dataset.edit)
    assert not (tmp_path / "cache" / "latents").exists() or not any((tmp_path / "cache" / "latents").iterdir())


@pytest.fixture(scope="module")
def with_lora():
    """A tiny 2.1 model set whose transformer carries a LoRA with non-zero weights (shared with the pipeline)."""
    from trainer_core.adapters.lora import inject_lora

    components = get_family(FAMILY).tiny_components(seed=1, storage="float32")
    generator = torch.Generator().manual_seed(5)
    for p in inject_lora(components.transformer, LoraConfig(rank=4, targets="all"), seed=0):
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    return components


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_preview_with_a_reference_equals_the_pipelines_own_sampling(with_lora, tmp_path, cfg):
    """The preview (cached reference latents and prompts, or the reference given now) equals `QwenImage21Pipeline`
    run from the prompt and the image itself, with the same LoRA, seed, size, steps and guidance."""
    from trainer_core.data.cache import build_cache
    from trainer_core.families.sampling import sample_image

    components, prompt, negative = with_lora, "paint the circle green", "blurry"
    reference = reference_picture()
    dataset = edit_dataset(tmp_path / "d", reference)
    cached = build_cache(components, list(dataset.samples), tmp_path / "cache", preview_prompts=[prompt],
                         negative_prompt=negative, settings=dataset.edit)
    settings = dict(width=64, height=96, steps=2, cfg_scale=cfg, seed=3)
    ours = sample_image(components, cached, prompt, negative, **settings)
    assert components.text_encoder is None  # the cached preview ran without the encoder
    given = sample_image(components, cached, prompt, negative, **settings, condition_images=[reference])
    components.ensure_text_encoder()  # for the pipeline's own encoding of the prompt and the image
    theirs = pipeline(components)(prompt=prompt, image=reference, negative_prompt=negative, true_cfg_scale=cfg,
                                  width=64, height=96, num_inference_steps=2, output_resolution=RESOLUTION,
                                  generator=torch.Generator("cpu").manual_seed(3)).images[0]
    plain = pipeline(components)(prompt=prompt, negative_prompt=negative, true_cfg_scale=cfg, width=64, height=96,
                                 num_inference_steps=2, generator=torch.Generator("cpu").manual_seed(3)).images[0]
    assert ours.size == (64, 96)
    assert np.array_equal(np.asarray(ours), np.asarray(theirs))
    assert np.array_equal(np.asarray(given), np.asarray(theirs))
    assert not np.array_equal(np.asarray(plain), np.asarray(theirs))  # the reference changes the sample


def test_a_micro_batch_of_two_edits_lays_out_its_prompts_slots_as_the_pipeline_batches_them(tiny21, tmp_path):
    """Two samples with captions of different lengths and references of one size: our img_mask rows are the
    pipeline's for the two prompts encoded as one batch with the image (slots right-padded, target slots after),
    and a step on the micro-batch trains."""
    from trainer_core.data.cache import build_cache
    from trainer_core.families.qwen_image21.objective import transformer_kwargs
    from trainer_core.models.text import pad_prompt_batch

    folder = tmp_path / "d"
    folder.mkdir()
    Image.new("RGB", (192, 64), (40, 60, 200)).save(folder / "b.png")
    (folder / "b.txt").write_text("paint the circle a deep ocean blue with a thin white outline")
    reference_picture(colour=(220, 200, 30)).save(folder / "b_control.png")
    dataset = edit_dataset(folder)
    assert len(dataset.samples) == 2
    cached = build_cache(tiny21, list(dataset.samples), tmp_path / "cache", settings=dataset.edit)
    keys = [s.text_key for s in cached.samples]
    embeds = [cached.embedding(k) for k in keys]
    text, mask = pad_prompt_batch(embeds)
    grid = (2, 6)
    references = [[cached.latents(k) for k in s.condition_keys] for s in cached.samples]
    ours = transformer_kwargs(torch.zeros(2, 12, 8), grid, text, mask, references,
                              [cached.text_tensor(k, "image_slots") for k in keys])
    tiny21.ensure_text_encoder()
    pipe = pipeline(tiny21)
    rgba = reference_picture().convert("RGBA")
    image = pipe.image_processor.resize(rgba, width=352, height=224)
    _e, their_mask, slots = pipe.encode_prompt([s.caption for s in cached.samples], image=[image],
                                               device=torch.device("cpu"))
    assert torch.equal(ours["img_mask"], torch.cat([slots, slots.new_ones(2, 12 // 4)], dim=1))
    assert torch.equal(ours["encoder_hidden_states_mask"].bool(), their_mask.bool())
    assert ours["img_shapes"] == [[(1, 14, 22), (1, 2, 6)]] * 2 and ours["hidden_states"].shape == (2, 308 + 12, 8)

    trainer = Trainer(tiny21, cached, LoraConfig(rank=4), OptimizerConfig(optimizer="adamw"),
                      TrainConfig(run_name="q21edit2", seed=7, blocks_to_swap=0, gradient_checkpointing=False,
                                  micro_batch_size=2, caption_dropout=0.5))
    try:
        losses = trainer.train(2).losses
    finally:
        trainer.close()
    assert len(losses) == 2 and all(np.isfinite(losses))


def ten_references() -> list[Image.Image]:
    """Ten references of different sizes and colours (2.1 edits with up to ten)."""
    sizes = [(320, 200), (300, 300), (256, 384), (400, 256), (288, 288), (352, 224), (224, 352), (300, 260),
             (260, 300), (384, 256)]
    return [reference_picture(size, (25 * i, 200 - 15 * i, 60 + 17 * i)) for i, size in enumerate(sizes)]


def test_ten_references_train_as_the_pipelines_pieces_do_and_preview_as_the_pipeline_does(tiny21, with_lora,
                                                                                           tmp_path):
    """An edit dataset sample with ten references (name_control.png ... name_control_10.png): its first training step
    equals the one rebuilt from the pipeline's pieces with all ten, bit for bit, and a preview of a LoRA trained on
    such data (the cached references, or the ten given now) equals `QwenImage21Pipeline` given the ten images."""
    from trainer_core.data.cache import build_cache
    from trainer_core.families.sampling import sample_image

    references = ten_references()
    dataset = edit_dataset(tmp_path / "d", references[0], more=references[1:])
    (sample,) = dataset.samples
    assert len(sample.controls) == 10
    tiny21.ensure_text_encoder()  # an earlier cache build released it
    expected, inputs, _, _ = reference_loss(tiny21, sample, references, seed=7)
    cached = build_cache(tiny21, list(dataset.samples), tmp_path / "cache", settings=dataset.edit)
    (entry,) = cached.samples
    assert len(entry.condition_keys) == 10
    loss, ours = first_call(tiny21.transformer, lambda: one_step_loss(tiny21, cached, "q21ten"))
    for name in ("hidden_states", "encoder_hidden_states", "img_mask", "timestep"):
        assert torch.equal(ours[name], inputs[name]), name
    assert len(ours["img_shapes"][0]) == 11 and ours["img_shapes"] == inputs["img_shapes"]  # ten references + target
    assert loss == expected

    prompt, settings = "paint the circles green", dict(width=64, height=96, steps=2, cfg_scale=1.0, seed=3)
    cached = build_cache(with_lora, list(dataset.samples), tmp_path / "cache_lora", preview_prompts=[prompt],
                         settings=dataset.edit)
    from_cache = sample_image(with_lora, cached, prompt, **settings)
    given = sample_image(with_lora, cached, prompt, **settings, condition_images=references)
    with_lora.ensure_text_encoder()
    theirs = pipeline(with_lora)(prompt=prompt, image=references, width=64, height=96, num_inference_steps=2,
                                 output_resolution=RESOLUTION, generator=torch.Generator("cpu").manual_seed(3)).images[0]
    assert np.array_equal(np.asarray(from_cache), np.asarray(theirs))
    assert np.array_equal(np.asarray(given), np.asarray(theirs))
