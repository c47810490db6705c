"""Qwen-Image-Layered: the dataset convention and its errors, the loaders (ComfyUI's files and a diffusers
folder; the family read from the transformer), and one training step's loss against a reference built from
the pinned `QwenImageLayeredPipeline`'s own pieces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from conftest import one_step_loss
from trainer_core.core.config import DatasetConfig, LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.data.cache import build_cache
from trainer_core.families.qwen_image_layered.data import crop_rgba, load_layered_dataset
from trainer_core.families.qwen_image_layered.family import QWEN_IMAGE_LAYERED
from trainer_core.families.qwen_image_layered.tiny import build_tiny_layered_components
from trainer_core.models.text import template_prefix_length
from trainer_core.training import Trainer, randomness
from trainer_core.training.objective import sample_noise_levels


def write_sample(folder: Path, name: str, caption: str, size=(64, 64), layers: int = 2) -> None:
    """A composite (a card with a square) and its layers: the card, then the square on transparency."""
    folder.mkdir(parents=True, exist_ok=True)
    card = Image.new("RGBA", size, (90, 120, 200, 255))
    square = Image.new("RGBA", size, (0, 0, 0, 0))
    square.paste((230, 60, 40, 255), (size[0] // 4, size[1] // 4, 3 * size[0] // 4, 3 * size[1] // 4))
    Image.alpha_composite(card, square).convert("RGB").save(folder / f"{name}.png")
    (folder / f"{name}.txt").write_text(caption)
    for i, layer in enumerate([card, square, square.rotate(90)][:layers], start=1):
        layer.save(folder / f"{name}_layer_{i}.png")


def cfg(folder: Path) -> DatasetConfig:
    return DatasetConfig(folder=str(folder), resolution=64, min_bucket_side=32, max_bucket_side=128)


@pytest.fixture(scope="module")
def layered_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("layered")
    write_sample(folder, "a", "a red square on a blue card")
    write_sample(folder, "b", "a red square on a blue card, turned", layers=2)
    return folder


@pytest.fixture(scope="module")
def layered_trainer(layered_data, tmp_path_factory):
    """The tiny Layered model after 2 steps of rank 4, alpha 6 on every target (read it, do not train it)."""
    components = build_tiny_layered_components()
    dataset = load_layered_dataset(cfg(layered_data))
    cached = build_cache(components, list(dataset.samples), tmp_path_factory.mktemp("layered_cache"))
    trainer = Trainer(components, cached, LoraConfig(rank=4, alpha=6.0, targets="all"),
                      OptimizerConfig(learning_rate=5e-3), TrainConfig(run_name="layered", blocks_to_swap=0))
    trainer.train(2)
    yield trainer
    trainer.close()


def test_folder_convention_finds_the_layers_in_order(layered_data):
    samples = load_layered_dataset(cfg(layered_data)).samples
    assert [Path(s.image_path).name for s in samples] == ["a.png", "b.png"]  # layers are no samples
    assert [Path(layer.path).name for layer in samples[0].layers] == ["a_layer_1.png", "a_layer_2.png"]


@pytest.mark.parametrize("break_it, message", [
    (lambda d: [p.unlink() for p in d.glob("a_layer_*")], "a.png has no layers"),
    (lambda d: (d / "a_layer_2.png").rename(d / "a_layer_3.png"), "has layer 3 but not layer 2"),
    (lambda d: Image.new("RGBA", (8, 8)).save(d / "zz_layer_1.png"), "zz_layer_1.png belongs to no composite"),
    (lambda d: Image.new("RGBA", (48, 64)).save(d / "a_layer_2.png"), "a_layer_2.png is 48x64, but its composite"),
    (lambda d: Image.new("RGB", (64, 64)).save(d / "a_layer_1.png"), "a_layer_1.png has no alpha channel"),
])
def test_wrong_layers_are_refused_by_name(tmp_path, break_it, message):
    write_sample(tmp_path, "a", "a red square")
    break_it(tmp_path)
    with pytest.raises(UserInputError, match=message):
        load_layered_dataset(cfg(tmp_path))


def test_text_to_image_refuses_a_layered_dataset_and_layered_a_plain_one(layered_data, tmp_path):
    from trainer_core.families.qwen_image import QWEN_IMAGE

    with pytest.raises(UserInputError, match="layered dataset"):
        QWEN_IMAGE.check_samples(list(load_layered_dataset(cfg(layered_data)).samples))
    from trainer_core.data.images import discover

    Image.new("RGB", (64, 64)).save(tmp_path / "plain.png")
    (tmp_path / "plain.txt").write_text("x")
    with pytest.raises(UserInputError, match="plain.png has no layers"):
        QWEN_IMAGE_LAYERED.check_samples(discover(cfg(tmp_path)))


@pytest.mark.parametrize("layout", ["comfyui", "diffusers"])
def test_exported_files_load_as_layered_with_its_flags_and_rgba_vae(tmp_path, layout):
    from trainer_core.families import get_family
    from trainer_core.families.loading import LoadRequest, load_model_set
    from trainer_core.families.qwen_image_layered.files import load_layered_single_files
    from trainer_core.models.source import DIFFUSERS

    files = get_family("qwen-image-layered").export_tiny(tmp_path, layout=layout)
    if layout == "diffusers":  # the Load node's request: the folder's transformer config says Layered
        components = load_model_set(LoadRequest(DIFFUSERS, "cpu", storage="float32", compute_dtype="float32",
                                                diffusers_folder=str(files["diffusers_folder"])))
    else:
        components = load_layered_single_files(files["transformer_bf16"], files["text_encoder_bf16"], files["vae"],
                                               storage="float32", compute_dtype=torch.float32)
        components.ensure_transformer()
    assert components.family is QWEN_IMAGE_LAYERED
    config = components.transformer.config
    assert config.use_additional_t_cond and config.use_layer3d_rope
    assert components.ensure_vae().config.input_channels == 4
    reference = build_tiny_layered_components()
    theirs = reference.transformer.state_dict()
    ours = components.transformer.state_dict()
    assert ours.keys() == theirs.keys()
    cast = torch.bfloat16 if layout == "comfyui" else torch.float32  # ComfyUI's files are bf16
    assert all(torch.equal(ours[k], theirs[k].to(cast).float()) for k in theirs)


def test_a_layered_transformer_with_an_rgb_vae_is_refused_by_the_vae_files_name(tmp_path):
    from diffusers import AutoencoderKLQwenImage

    from trainer_core.families import get_family
    from trainer_core.models.part_files import public_config, write_part_file
    from trainer_core.families.qwen_image_layered.files import load_layered_single_files
    from trainer_core.families.qwen_image_layered.tiny import TINY_LAYERED_VAE
    from trainer_core.models.vae_file import vae_file_tensors

    files = get_family("qwen-image-layered").export_tiny(tmp_path)
    rgb = AutoencoderKLQwenImage(**{**TINY_LAYERED_VAE, "input_channels": 3})
    path = write_part_file(vae_file_tensors(rgb), tmp_path / "vae" / "rgb_vae.safetensors", "vae", "bf16",
                           public_config(rgb.config))
    with pytest.raises(UserInputError, match="rgb_vae.safetensors takes 3-channel images"):
        load_layered_single_files(files["transformer_bf16"], files["text_encoder_bf16"], path, storage="float32",
                                  compute_dtype=torch.float32)


def reference_loss(components, folder: Path, seed: int, weights: torch.Tensor | None = None) -> float:
    """One training step's loss from the pipeline's own pieces: prompt encoding, RGBA preprocessing, VAE
    encoding of each frame, frame packing, the condition latents, `img_shapes`, mu, `additional_t_cond`.
    `weights`: a loss mask on the latent grid (h, w), weighing every frame alike, packed by the pipeline's packing."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImageLayeredPipeline

    pipe = QwenImageLayeredPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config), vae=components.vae,
        text_encoder=components.text_encoder, tokenizer=components.tokenizer, processor=None,
        transformer=components.transformer)
    pipe.prompt_template_encode_start_idx = template_prefix_length(components.tokenizer, pipe.prompt_template_encode)
    sample = load_layered_dataset(cfg(folder)).samples[0]
    w, h = sample.bucket
    images = [crop_rgba(Image.open(p).convert("RGBA"), sample.bucket)  # the bucket's crop is the data's choice
              for p in [sample.image_path, *(layer.path for layer in sample.layers)]]
    pixels = [pipe.image_processor.preprocess(img, h, w).unsqueeze(2) for img in images]  # (1, 4, 1, H, W)
    frames = torch.cat([pipe._encode_vae_image(p, None) for p in pixels], dim=2)  # (1, C, F, h, w)
    c, f, lh, lw = frames.shape[1:]
    _, condition = pipe.prepare_latents(pixels[0], 1, c, h, w, f - 1, torch.float32, "cpu", None)
    prompt, mask = pipe.encode_prompt(sample.caption, max_sequence_length=512)
    noise = torch.randn(frames.shape, generator=randomness.generator(seed, 0, randomness.NOISE))
    mu = (condition.shape[1] / (256 * 256 / 16 / 16)) ** 0.5  # as QwenImageLayeredPipeline.__call__
    s = sample_noise_levels(1, randomness.generator(seed, 0, randomness.NOISE_LEVELS), "logit_normal", 0.0, 1.0, mu)
    x_t = (1 - s) * frames + s * noise

    def pack(x):  # (1, C, F, h, w) -> frame after frame, as the pipeline's prepare_latents packs its noise
        return pipe._pack_latents(x.permute(0, 2, 1, 3, 4), 1, c, lh, lw, f)

    img_shapes = [[*[(1, lh // 2, lw // 2)] * f, (1, lh // 2, lw // 2)]]
    with torch.no_grad():
        prediction = components.transformer(
            hidden_states=torch.cat([pack(x_t), condition], dim=1), timestep=s, encoder_hidden_states=prompt,
            encoder_hidden_states_mask=mask, img_shapes=img_shapes, additional_t_cond=torch.zeros(1, dtype=torch.long),
            return_dict=False)[0][:, : f * (lh // 2) * (lw // 2)]
    if weights is not None:
        w = pack(weights.expand(1, c, f, lh, lw))
        return float((w * (prediction.float() - pack(noise - frames).float()) ** 2).sum() / w.sum())
    return float(torch.nn.functional.mse_loss(prediction.float(), pack(noise - frames).float()))


def test_one_training_step_loss_equals_the_reference_from_the_pipelines_pieces(tmp_path):
    components = build_tiny_layered_components()
    write_sample(tmp_path / "d", "a", "a red square on a blue card", size=(128, 64))
    expected = reference_loss(components, tmp_path / "d", seed=7)
    dataset = load_layered_dataset(cfg(tmp_path / "d"))
    cached = build_cache(components, list(dataset.samples), tmp_path / "cache")
    assert cached.latents(cached.samples[0].latent_key).shape[1] == 3  # composite + 2 layers, as frames
    loss = one_step_loss(components, cached, "ref", lora=LoraConfig(rank=4, alpha=4.0), caption_dropout=0.0)
    assert loss == expected  # the same operations on the same numbers: bit for bit


def test_a_loss_mask_weighs_the_composite_and_every_layer_alike(tmp_path):
    """A mask beside a composite (name_mask.png, background weight 0): one mask over every frame the loss covers, the
    composite's and each layer's, as aligned as the layers are (issue 45: it was cached, then the first step failed
    in the frame packing: 'not enough values to unpack'). Against the pipeline's pieces, its packing of the mask."""
    from PIL import ImageDraw

    components = build_tiny_layered_components()
    write_sample(tmp_path / "d", "a", "a red square on a blue card", size=(128, 64))
    mask = Image.new("L", (128, 64), 0)
    ImageDraw.Draw(mask).rectangle((0, 0, 63, 63), fill=255)  # the left half trains
    mask.save(tmp_path / "d" / "a_mask.png")
    dataset = load_layered_dataset(DatasetConfig(folder=str(tmp_path / "d"), resolution=64, min_bucket_side=32,
                                                 max_bucket_side=128, mask_background_weight=0.0))
    cached = build_cache(components, list(dataset.samples), tmp_path / "cache")
    weights = cached.mask_weights(cached.samples[0].mask_key)  # (h, w) on the latent grid
    assert weights.min() == 0 and weights.max() == 1  # some cells count, some do not
    components.ensure_text_encoder()  # the cache released it
    expected = reference_loss(components, tmp_path / "d", seed=7, weights=weights)
    loss = one_step_loss(components, cached, "masked", lora=LoraConfig(rank=4, alpha=4.0), caption_dropout=0.0)
    assert loss == pytest.approx(expected, rel=1e-6)
    assert loss != pytest.approx(reference_loss(components, tmp_path / "d", seed=7), rel=1e-3)  # the mask counts


@pytest.mark.slow
def test_layered_demo_from_exported_files_writes_a_lora_diffusers_layered_pipeline_loads_on_every_module(tmp_path,
                                                                                                       capsys):
    """`demo --model qwen-image-layered` on export-tiny's files: the family is read from them, the LoRA,
    preview and plot are written, and diffusers' own loader (`QwenImageLayeredPipeline.load_lora_weights`)
    gives every module of the file its adapter, with the file's weights."""
    from diffusers import QwenImageLayeredPipeline
    from safetensors.torch import load_file

    from trainer_core.families import get_family
    from trainer_core.runs.cli import main

    files = get_family("qwen-image-layered").export_tiny(tmp_path / "files")
    args = ["--transformer", str(files["transformer_fp8_e4m3fn_scaled"]), "--text-encoder",
            str(files["text_encoder_bf16"]), "--vae", str(files["vae"])]
    assert main(["demo", "--model", "qwen-image-layered", *args, "--steps", "3", "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    assert "(qwen-image-layered)" in capsys.readouterr().out
    assert Image.open(out / "preview.png").size == (4 * 3 * 64, 4 * 64)  # the composite and its 2 layers, 4x
    lora = load_file(str(out / "layered_lora.safetensors"))
    components = build_tiny_layered_components()
    pipe = QwenImageLayeredPipeline(scheduler=None, vae=components.vae, text_encoder=None, tokenizer=None,
                                    processor=None, transformer=components.transformer)
    pipe.load_lora_weights(str(out / "layered_lora.safetensors"))
    modules = {k[len("diffusion_model."):-len(".alpha")] for k in lora if k.endswith(".alpha")}
    loaded = {name for name, m in pipe.transformer.named_modules() if hasattr(m, "lora_A") and len(m.lora_A)}
    assert loaded == modules
    for name in modules:
        m = pipe.transformer.get_submodule(name)
        weight = lora[f"diffusion_model.{name}.lora_B.weight"].float()
        assert torch.equal(m.lora_B[next(iter(m.lora_B))].weight.float(), weight)
