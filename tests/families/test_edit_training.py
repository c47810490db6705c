"""Edit training: the dataset convention and its errors, the cache, and one training step's loss against a
reference loss made with the pinned diffusers edit pipelines' own pieces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from conftest import one_step_loss
from test_edit_pipelines import control_images, oracle_pipeline, small_pipeline_sizes  # noqa: F401 (fixture)
from trainer_core.core.config import DatasetConfig, LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.data.images import load_cropped
from trainer_core.data.cache import build_cache
from trainer_core.core.config import EditDataConfig
from trainer_core.data.edit_dataset import discover_edit, load_edit_dataset
from trainer_core.families.qwen_image_edit.tiny import build_tiny_edit_components
from trainer_core.families.qwen_image_edit.variants import get_variant
from trainer_core.core.errors import UserInputError
from trainer_core.models.tiny import build_tiny_tokenizer
from trainer_core.training.objective import resolution_mu, sample_noise_levels
from trainer_core.training import randomness


def write_sample(folder: Path, name: str, caption: str, controls: list[Image.Image], subfolder: bool = False,
                 size=(64, 64)) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (200, 60, 40)).save(folder / f"{name}.png")
    (folder / f"{name}.txt").write_text(caption)
    for i, img in enumerate(controls, start=1):
        if subfolder:
            (folder / "control").mkdir(exist_ok=True)
            img.save(folder / "control" / (f"{name}.png" if i == 1 else f"{name}_{i}.png"))
        else:
            img.save(folder / (f"{name}_control.png" if i == 1 else f"{name}_control_{i}.png"))


SMALL = EditDataConfig(control_resolution=128)  # controls a CPU can afford (the model's rule is ~1024 px)


def cfg(folder: Path) -> DatasetConfig:
    return DatasetConfig(folder=str(folder), resolution=64, min_bucket_side=32, max_bucket_side=128)


def test_folder_convention_finds_controls_in_order_in_either_form(tmp_path):
    images = control_images()
    write_sample(tmp_path, "a", "make it blue", images[:2])
    write_sample(tmp_path, "b", "make it green", images[:3], subfolder=True)
    samples = discover_edit(cfg(tmp_path))
    assert [Path(s.image_path).name for s in samples] == ["a.png", "b.png"]  # controls are no targets
    assert [Path(c.path).name for c in samples[0].controls] == ["a_control.png", "a_control_2.png"]
    assert [Path(c.path).name for c in samples[1].controls] == ["b.png", "b_2.png", "b_3.png"]
    assert [(c.width, c.height) for c in samples[1].controls] == [img.size for img in images[:3]]


@pytest.mark.parametrize("break_it, message", [
    (lambda d: [p.unlink() for p in d.glob("a_control*")], "a.png has no control image"),
    (lambda d: control_images()[0].save(d / "zz_control.png"), "belongs to no training image"),
    (lambda d: control_images()[0].save(d / "a_control_11.png"), "has number 11"),
    (lambda d: (d / "a_control_2.png").rename(d / "a_control_3.png"), "has control 3 but not control 2"),
    (lambda d: ((d / "control").mkdir(), control_images()[0].save(d / "control" / "a.png")), "use one form per sample"),
])
def test_missing_extra_or_misnumbered_controls_are_refused_by_name(tmp_path, break_it, message):
    write_sample(tmp_path, "a", "edit", control_images()[:2])
    break_it(tmp_path)
    with pytest.raises(UserInputError, match=message):
        discover_edit(cfg(tmp_path))


def test_control_count_and_aspect_the_variant_cannot_take_are_refused_by_name(tmp_path):
    write_sample(tmp_path / "two", "a", "edit", control_images()[:2])
    with pytest.raises(UserInputError, match="a.png has 2 control images, but edit takes 1"):
        build_cache(build_tiny_edit_components("edit"), list(discover_edit(cfg(tmp_path / "two"))),
                    tmp_path / "cache", settings=SMALL)
    write_sample(tmp_path / "thin", "a", "edit", [Image.new("RGB", (400, 20), "red")])
    with pytest.raises(UserInputError, match=r"control image .*a_control.png is 400x20 px.*cannot keep its aspect"):
        build_cache(build_tiny_edit_components("edit-2511"), list(discover_edit(cfg(tmp_path / "thin"))),
                    tmp_path / "cache", settings=SMALL)
    # 210:1 at control_resolution 0 (the model's 1024 px rule): 14848 x 64 px, which the text encoder's image processor
    # refuses (over 200:1). Before: its raw ValueError, after the VAE had encoded the control.
    write_sample(tmp_path / "thinner", "a", "edit", [Image.new("RGB", (2100, 10), "red")])
    with pytest.raises(UserInputError, match=r"control image .*a_control.png is 2100x10 px: the text encoder's image "
                                             r"processor refuses it at 14848x64 px \(the model default\): absolute "
                                             r"aspect ratio .* under 200:1\."):
        build_cache(build_tiny_edit_components("edit"), list(discover_edit(cfg(tmp_path / "thinner"))),
                    tmp_path / "cache", settings=EditDataConfig(control_resolution=0))
    # The same image wired into Preview (Edit) on the canvas
    from trainer_core.families.qwen_image_edit.sampling import encode_given_controls

    with pytest.raises(UserInputError, match=r"control image 1 \(wired into the preview\) is 2100x10 px: the text "
                                             r"encoder's image processor refuses it"):
        encode_given_controls(build_tiny_edit_components("edit"), get_variant("edit"),
                              [Image.new("RGB", (2100, 10), "red")], ["edit"], None)


def test_cache_is_keyed_by_prompt_controls_and_models(tmp_path):
    write_sample(tmp_path / "d", "a", "make it blue", control_images()[:2])
    components = build_tiny_edit_components("edit-2509")
    first = build_cache(components, list(discover_edit(cfg(tmp_path / "d"))), tmp_path / "c", settings=SMALL)
    assert first.report.latents_encoded == 3 and first.report.prompts_encoded == 2  # target + 2 controls; caption, ""
    again = build_cache(components, list(discover_edit(cfg(tmp_path / "d"))), tmp_path / "c", settings=SMALL)
    assert (again.report.latents_encoded, again.report.prompts_encoded) == (0, 0)
    control_images()[2].save(tmp_path / "d" / "a_control_2.png")  # another control 2: its latent and the prompts
    changed = build_cache(components, list(discover_edit(cfg(tmp_path / "d"))), tmp_path / "c", settings=SMALL)
    assert (changed.report.latents_encoded, changed.report.prompts_encoded) == (1, 2)
    assert changed.samples[0].text_key != first.samples[0].text_key
    assert changed.samples[0].condition_keys[0] == first.samples[0].condition_keys[0]
    other = build_tiny_edit_components("edit-2509", seed=1)  # other weights: nothing matches
    fresh = build_cache(other, list(discover_edit(cfg(tmp_path / "d"))), tmp_path / "c", settings=SMALL)
    assert (fresh.report.latents_encoded, fresh.report.prompts_encoded) == (3, 2)
    # The prompt embedding holds the image tokens: longer than the caption alone encodes.
    assert first.embedding(first.samples[0].text_key).shape[0] > len(build_tiny_tokenizer()("make it blue").input_ids)


class PipelineInputs:
    """A sample's transformer inputs from the pipeline's own pieces: its sizing, resizing, prompt encoding with
    images, VAE encoding, packing, concatenation, `img_shapes` and the cut to the target's tokens."""

    def __init__(self, components, variant, sample):
        from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as v1
        from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

        self.pipe = pipe = oracle_pipeline(components, variant)
        self.variant, self.sample = variant, sample
        images = [Image.open(c.path).convert("RGB") for c in sample.controls]
        self.conditions, vae_images, vae_sizes = [], [], []
        for img in images:
            ratio = img.width / img.height
            if variant.multi_image:  # as QwenImageEditPlusPipeline.__call__
                cw, ch = plus.calculate_dimensions(plus.CONDITION_IMAGE_SIZE, ratio)
                vw, vh = plus.calculate_dimensions(plus.VAE_IMAGE_SIZE, ratio)
                self.conditions.append(pipe.image_processor.resize(img, ch, cw))
                vae_images.append(pipe.image_processor.preprocess(img, vh, vw).unsqueeze(2))
            else:  # as QwenImageEditPipeline.__call__
                vw, vh, _ = v1.calculate_dimensions(1024 * 1024, ratio)
                self.conditions.append(pipe.image_processor.resize(img, vh, vw))
                vae_images.append(pipe.image_processor.preprocess(self.conditions[-1], vh, vw).unsqueeze(2))
            vae_sizes.append((vw, vh))
        f = self.f = pipe.vae_scale_factor
        w, h = sample.bucket
        self.c = pipe.latent_channels
        dtype = components.compute_dtype
        _, self.image_latents = pipe.prepare_latents(vae_images if variant.multi_image else vae_images[0], 1, self.c,
                                                     h, w, dtype, "cpu", None)
        self.x0 = pipe._encode_vae_image(load_cropped(sample.image_path, sample.bucket).unsqueeze(0).unsqueeze(2),
                                         None)[:, :, 0]  # (1, C, h, w)
        self.n = (h // f // 2) * (w // f // 2)
        self.img_shapes = [[(1, h // f // 2, w // f // 2), *[(1, vh // f // 2, vw // f // 2) for vw, vh in vae_sizes]]]

    def pack(self, latents):
        w, h = self.sample.bucket
        return self.pipe._pack_latents(latents, 1, self.c, h // self.f, w // self.f)

    def prediction(self, transformer, caption: str, x0, noise, s):
        """`transformer`'s prediction (1, N, 4C) of the target's tokens at x_t of x0 (1, C, h, w) and noise, level
        s (1,), for `caption` encoded with the sample's control images."""
        images = self.conditions if self.variant.multi_image else self.conditions[0]
        prompt, mask = self.pipe.encode_prompt(caption, image=images)
        x_t = (1 - s) * x0 + s * noise
        with torch.no_grad():
            return transformer(
                hidden_states=torch.cat([self.pack(x_t), self.image_latents], dim=1), timestep=s,
                encoder_hidden_states=prompt, encoder_hidden_states_mask=mask, img_shapes=self.img_shapes,
                return_dict=False)[0][:, : self.n]


def reference_loss(components, variant, folder: Path, seed: int) -> float:
    """One training step's loss from the pipeline's own pieces (`PipelineInputs`)."""
    ref = PipelineInputs(components, variant, discover_edit(cfg(folder))[0])
    x0 = ref.x0
    # The trainer's draws for its first micro-batch (training/randomness.py): noise, and the noise level.
    noise = torch.randn(x0.shape, generator=randomness.generator(seed, 0, randomness.NOISE))
    s = sample_noise_levels(1, randomness.generator(seed, 0, randomness.NOISE_LEVELS), "logit_normal", 0.0, 1.0,
                            resolution_mu(ref.n, components.scheduler_config))
    prediction = ref.prediction(components.transformer, ref.sample.caption, x0, noise, s)
    target = ref.pack(noise - x0)
    return float(torch.nn.functional.mse_loss(prediction.float(), target.float()))


@pytest.mark.parametrize("variant_name, count", [("edit", 1), ("edit-2509", 3), ("edit-2511", 2)])
def test_one_training_step_loss_equals_the_reference_from_the_pipelines_pieces(small_pipeline_sizes, tmp_path,
                                                                               variant_name, count):
    variant = get_variant(variant_name)
    components = build_tiny_edit_components(variant_name)
    write_sample(tmp_path / "d", "a", "paint it red", control_images()[:count], size=(96, 64))
    expected = reference_loss(components, variant, tmp_path / "d", seed=7)

    dataset = load_edit_dataset(cfg(tmp_path / "d"), EditDataConfig(control_resolution=0))  # the model's own rule
    cached = build_cache(components, list(dataset.samples), tmp_path / "cache", settings=dataset.edit)
    loss = one_step_loss(components, cached, "ref", lora=LoraConfig(rank=4, alpha=4.0))
    assert loss == expected  # the same operations on the same numbers: bit for bit


def test_memory_plan_counts_the_control_tokens(tmp_path):
    from trainer_core.families.base import conditioned_image_size as planned_image_size  # Edit's term
    from trainer_core.planner.for_run import inputs_for_run

    write_sample(tmp_path / "d", "a", "edit", control_images()[:2])
    cached = build_cache(build_tiny_edit_components("edit-2509"), list(discover_edit(cfg(tmp_path / "d"))),
                         tmp_path / "c", settings=SMALL)
    sizes = cached.samples[0].condition_sizes  # (160, 96) and (128, 128): 15360 + 16384 px beside the 64x64 target
    assert planned_image_size(cached) == (64, -(-(64 * 64 + sum(w * h for w, h in sizes)) // (64 * 32)) * 32)
    inputs = inputs_for_run(build_tiny_edit_components("edit-2509"), cached, LoraConfig(), OptimizerConfig(),
                            TrainConfig())
    assert (inputs.width, inputs.height) == planned_image_size(cached)
    # Its caching plan sees the controls as the vision tower does: the encoder's view on the processor's 28 px grid.
    from trainer_core.families.qwen_image_edit.pipelines import control_size, processor_view
    from trainer_core.planner.caching import cache_steps
    from trainer_core.planner.inference import parts_for_components
    from trainer_core.planner.references import vision_bytes

    variant = build_tiny_edit_components("edit-2509").family.variant
    conditions = [control_size(variant, w, h, SMALL.control_resolution or None).condition
                  for w, h in (c.size for c in control_images()[:2])]
    views = tuple(processor_view(c) for c in conditions)
    assert inputs.vision_sizes == views  # from the cached VAE sizes: the same encoder images here
    parts = parts_for_components(build_tiny_edit_components("edit-2509"))
    assert parts.vision_layers == 1 and parts.vision_working_per_patch_channel > 0
    prompts, _ = cache_steps(inputs, parts)
    forward = next(t for t in prompts if t.name == "text encoder forward")
    assert f"with 2 image(s) ({', '.join(f'{w}x{h}' for w, h in views)})" in forward.note
    assert forward.bytes >= vision_bytes(parts, views, 4)[0]  # float32 tiny model
