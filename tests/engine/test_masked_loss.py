"""Masked loss: a mask per training image weights its flow loss per latent position (data/masks.py,
training/masked_loss.py). Exact relations on the tiny model: a mask of ones is no mask, bit for bit (loss,
LoRA gradients, steps); a half mask at background weight 0 is the loss over the kept half, and grey weights
are the weighted mean, both against an oracle that crops the unpacked prediction; the mask lands on the
latent positions of the same shape in its image; the cache follows the mask's bytes; errors name the file;
an Edit dataset's target takes a mask and validation uses it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

from conftest import tiny_dataset_config
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.data.cache import build_cache
from trainer_core.data.images import discover, load_cropped, load_dataset
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.models.latents import pack_latents, unpack_latents
from trainer_core.models.text import pad_prompt_batch
from trainer_core.runs.registry import run_signature
from trainer_core.training import Trainer
from trainer_core.training.masked_loss import masked_flow_loss
from trainer_core.training.objective import flow_loss, noisy_latents, velocity_target

SIZE = 64


def write_images(folder: Path, count: int = 4) -> Path:
    """`count` 64x64 images (a coloured bar on white, each elsewhere) with captions."""
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        img = Image.new("RGB", (SIZE, SIZE), "white")
        ImageDraw.Draw(img).rectangle((8 * n, 8, 8 * n + 20, 50), fill=(40 * n, 200 - 30 * n, 90))
        img.save(folder / f"img{n}.png")
        (folder / f"img{n}.txt").write_text(f"a bar at {n}")
    return folder


def mask_image(size=(SIZE, SIZE), left=255, right=0, split=None) -> Image.Image:
    """A grey mask: `left` on the columns before `split` (default: the middle), `right` after."""
    mask = Image.new("L", size, right)
    ImageDraw.Draw(mask).rectangle((0, 0, (size[0] // 2 if split is None else split) - 1, size[1]), fill=left)
    return mask


def make_trainer(components, cached, **train) -> Trainer:
    settings = dict(seed=5, micro_batch_size=2, run_name="masked")
    settings.update(train)
    return Trainer(components, cached, LoraConfig(rank=4, alpha=4.0, targets="all"),
                   OptimizerConfig(optimizer="adamw", learning_rate=2e-3), TrainConfig(**settings))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return write_images(tmp_path_factory.mktemp("plain"))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mask_cache")


@pytest.fixture(scope="module")
def encoder():
    """Tiny components for caching only (caching leaves the model as it is; a Trainer gets fresh ones)."""
    return build_tiny_components(seed=0, storage="float32")


def masked_copy(plain: Path, folder: Path, masks: dict[str, Image.Image], subfolder=False) -> Path:
    shutil.copytree(plain, folder)
    for name, mask in masks.items():
        if subfolder:
            (folder / "masks").mkdir(exist_ok=True)
            mask.save(folder / "masks" / f"{name}.png")
        else:
            mask.save(folder / f"{name}_mask.png")
    return folder


def lora_grads(trainer: Trainer, indices) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = trainer.built.flow.loss(trainer.built.flow.draw(trainer.progress.micro_batches, indices=indices))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.built.transformer.named_parameters() if p.grad is not None}
    trainer.built.optimizer.zero_grad(set_to_none=True)
    return loss.detach(), grads


def test_a_mask_of_ones_equals_no_mask_bit_for_bit(plain, cache_dir, tmp_path):
    """White masks (beside two images, in masks/ for one) at background weight 0: the weighted path runs, and
    its loss, LoRA gradients and three training steps equal those without masks, bit for bit."""
    white = Image.new("L", (SIZE, SIZE), 255)
    masked = masked_copy(plain, tmp_path / "beside", {"img0": white, "img1": white})
    white.resize((SIZE // 2, SIZE // 2)).save(masked / "img2_mask.webp", lossless=True)  # a scaled copy, any extension
    samples = discover(tiny_dataset_config(masked, mask_background_weight=0.0))
    assert [s.mask is not None for s in samples] == [True, True, True, False]
    components = build_tiny_components(seed=0, storage="float32")
    with_masks = build_cache(components, samples, cache_dir)
    without = build_cache(components, discover(tiny_dataset_config(plain)), cache_dir)
    assert all(s.mask_key for s in with_masks.samples[:3]) and not with_masks.samples[3].mask_key
    assert all(torch.equal(with_masks.mask_weights(s.mask_key), torch.ones(16, 16)) for s in with_masks.samples[:3])

    a, b = make_trainer(components, with_masks), make_trainer(build_tiny_components(seed=0, storage="float32"), without)
    a.train(1), b.train(1)  # lora_B is no longer 0: every LoRA tensor has a gradient
    for indices in ([0, 1], [2, 3]):  # masked with masked; a masked and an unmasked sample together
        (loss_a, grads_a), (loss_b, grads_b) = lora_grads(a, indices), lora_grads(b, indices)
        assert torch.equal(loss_a, loss_b)
        assert grads_a.keys() == grads_b.keys() and all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)
    a.train(2), b.train(2)
    assert a.progress.loss_history == b.progress.loss_history
    state_a, state_b = a.built.transformer.state_dict(), b.built.transformer.state_dict()
    assert all(torch.equal(state_a[n], state_b[n]) for n in state_a if ".lora_" in n)
    # the function itself: weights of ones are the plain mean, bit for bit, also at odd sizes
    g = torch.Generator().manual_seed(0)
    prediction, target = torch.randn(3, 49, 12, generator=g), torch.randn(3, 49, 12, generator=g)
    assert torch.equal(masked_flow_loss(prediction, target, torch.ones(3, 49, 12)), flow_loss(prediction, target))


def oracle_errors(trainer: Trainer, x0, noise, levels, embeds) -> torch.Tensor:
    """(B, C, h, w) squared errors of the transformer's prediction, unpacked back onto the latent grid, computed
    here from the objective's definition (not through the step's loss)."""
    h, w = x0.shape[-2:]
    text, text_mask = pad_prompt_batch(embeds)
    with torch.no_grad():
        prediction = trainer.built.transformer(
            hidden_states=pack_latents(noisy_latents(x0, noise, levels)), encoder_hidden_states=text,
            encoder_hidden_states_mask=text_mask, timestep=levels, img_shapes=[[(1, h // 2, w // 2)]] * len(x0),
            return_dict=False)[0]
    return (unpack_latents(prediction, h, w) - velocity_target(x0, noise)) ** 2


@pytest.mark.parametrize("background, right, right_weight", [
    (0.0, 0, 0.0),  # black ignored: the loss over the kept (left) half only
    (0.5, 51, 0.6),  # grey 51/255 = 0.2 at background 0.5: 0.5 + 0.5 * 0.2
])
def test_weights_make_the_weighted_mean_over_latent_positions(plain, cache_dir, tmp_path, background, right,
                                                              right_weight):
    masked = masked_copy(plain, tmp_path / "half", {f"img{n}": mask_image(right=right) for n in range(4)},
                         subfolder=True)
    components = build_tiny_components(seed=0, storage="float32")
    cached = build_cache(components, discover(tiny_dataset_config(masked, mask_background_weight=background)),
                         cache_dir)
    weights = cached.mask_weights(cached.samples[0].mask_key)  # (h, w) = (16, 16): the tiny VAE's factor is 4
    expected = torch.full((16, 16), right_weight)
    expected[:, :8] = 1.0
    torch.testing.assert_close(weights, expected, rtol=1e-6, atol=0)
    trainer = make_trainer(components, cached)
    trainer.train(1)
    trainer.built.transformer.eval()
    batch = trainer.built.flow.draw(trainer.progress.micro_batches, indices=[0, 1])
    embeds = [cached.embedding(s.text_key) for s in batch.samples]
    with torch.no_grad():
        loss = trainer.built.flow.loss(batch)  # caption dropout is 0: these embeddings are the ones it uses
    err = oracle_errors(trainer, batch.x0, batch.noise, batch.levels, embeds)
    left, rest = err[..., :8], err[..., 8:]
    if right_weight == 0.0:
        oracle = left.mean()  # cropped to the kept half
    else:
        oracle = (left.sum() + right_weight * rest.sum()) / (left.numel() + right_weight * rest.numel())
    torch.testing.assert_close(loss, oracle, rtol=2e-6, atol=0)
    assert not torch.allclose(loss, err.mean(), rtol=1e-3)  # and it is not the unmasked mean


def test_the_mask_is_resized_and_cropped_as_its_image(encoder, tmp_path):
    """A wide image (96x64) centre-cropped into the 64x64 bucket, its mask drawn at twice the size: the mask's
    rectangle lands on exactly the latent cells where the cropped image shows the same rectangle."""
    box = (24, 8, 40, 40)  # in the image; off-centre, edges on 4 px latent cells after the 16 px crop
    image = Image.new("RGB", (96, 64), "white")
    ImageDraw.Draw(image).rectangle((box[0], box[1], box[2] - 1, box[3] - 1), fill="black")
    image.save(tmp_path / "wide.png")
    (tmp_path / "wide.txt").write_text("a black bar")
    mask = Image.new("L", (192, 128), 0)
    ImageDraw.Draw(mask).rectangle((2 * box[0], 2 * box[1], 2 * box[2] - 1, 2 * box[3] - 1), fill=255)
    mask.save(tmp_path / "wide_mask.png")
    (sample,) = discover(tiny_dataset_config(tmp_path, mask_background_weight=0.0))
    assert sample.bucket == (64, 64)
    cached = build_cache(encoder, [sample], tmp_path / "cache")
    weights = cached.mask_weights(cached.samples[0].mask_key)  # (16, 16)
    pixels = load_cropped(sample.image_path, sample.bucket)  # (3, 64, 64) as the VAE saw it
    dark = torch.nn.functional.avg_pool2d((pixels.mean(0) < 0).float()[None, None], 4)[0, 0]  # (16, 16)
    assert torch.equal(weights, dark) and weights.sum() == (16 // 4) * (32 // 4)  # 4 x 8 cells of 1, the rest 0
    assert torch.equal(weights.nonzero().min(0).values, torch.tensor([2, 2]))  # rows 8/4, columns (24 - 16)/4


def test_the_cache_follows_the_mask_bytes_and_the_background_weight(plain, encoder, tmp_path):
    masked = masked_copy(plain, tmp_path / "edit", {"img0": mask_image()})
    components = encoder
    cache = tmp_path / "cache"
    first = build_cache(components, discover(tiny_dataset_config(masked, mask_background_weight=0.0)), cache)
    assert first.report.masks_made == 1 and "masks: 1 made, 0 from cache" in first.report.summary()
    again = build_cache(components, discover(tiny_dataset_config(masked, mask_background_weight=0.0)), cache)
    assert (again.report.masks_made, again.report.masks_reused, again.report.latents_encoded) == (1 - 1, 1, 0)
    mask_image(split=16).save(masked / "img0_mask.png")  # the mask edited: a new entry, the latent stays
    edited = build_cache(components, discover(tiny_dataset_config(masked, mask_background_weight=0.0)), cache)
    assert edited.report.masks_made == 1 and edited.report.latents_encoded == 0
    key_before, key_after = first.samples[0].mask_key, edited.samples[0].mask_key
    assert key_after != key_before and edited.samples[0].latent_key == first.samples[0].latent_key
    assert float(first.mask_weights(key_before).sum()) == 16 * 8
    assert float(edited.mask_weights(key_after).sum()) == 16 * 4
    lifted = build_cache(components, discover(tiny_dataset_config(masked, mask_background_weight=0.5)), cache)
    assert lifted.report.masks_made == 1 and lifted.samples[0].mask_key not in (key_before, key_after)
    # a live trainer is continued only on the same inputs: an edited mask rebuilds it (from its checkpoint)
    settings = (LoraConfig(), OptimizerConfig(), TrainConfig(), tmp_path / "run", None)
    assert run_signature(components, first, *settings) == run_signature(components, again, *settings)
    assert run_signature(components, first, *settings) != run_signature(components, edited, *settings)


def _write(path: Path, what) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    what.save(path) if isinstance(what, Image.Image) else path.write_bytes(what)


@pytest.mark.parametrize("name, what, message", [
    ("ghost_mask.png", mask_image(), "mask .*ghost_mask.png belongs to no training image"),
    ("masks/ghost.png", mask_image(), "mask .*masks/ghost.png belongs to no training image"),
    ("masks/img0.jpg", mask_image(), "image 'img0' has two masks, .*img0_mask.png and .*masks/img0.jpg"),
    ("img1_mask.png", mask_image(size=(64, 32)), "mask .*img1_mask.png is 64x32, but its image img1.png is 64x64"),
    ("img1_mask.png", Image.new("L", (64, 64), 0), "mask .*img1_mask.png is all black"),
    ("img1_mask.png", Image.new("RGBA", (64, 64), (255, 255, 255, 0)), "mask .*img1_mask.png is all black"),
    ("img1_mask.png", b"not an image at all", "mask img1_mask.png is not a usable image: .*cannot be read"),
])
def test_mask_errors_name_the_file(plain, tmp_path, name, what, message):
    folder = masked_copy(plain, tmp_path / "bad", {"img0": mask_image()})
    _write(folder / name, what)
    with pytest.raises(UserInputError, match=message):
        discover(tiny_dataset_config(folder))


def test_colour_masks_count_by_brightness_and_a_captioned_mask_name_is_an_image(plain, encoder, tmp_path):
    folder = masked_copy(plain, tmp_path / "colour", {})
    Image.new("RGB", (SIZE, SIZE), (255, 0, 0)).save(folder / "img0_mask.png")  # red: L = 76 (0.299 * 255)
    Image.new("RGB", (SIZE, SIZE), "white").save(folder / "img3_mask.png")
    (folder / "img3_mask.txt").write_text("a white square")  # its own caption: a training image, not a mask
    samples = {Path(s.image_path).name: s for s in discover(tiny_dataset_config(folder, mask_background_weight=0.0))}
    assert samples["img3_mask.png"].mask is None and samples["img3.png"].mask is None
    summary = load_dataset(tiny_dataset_config(folder, mask_background_weight=0)).summary()
    assert "1 with a loss mask (black weighs 0)" in summary
    cached = build_cache(encoder, [samples["img0.png"]], tmp_path / "c")
    torch.testing.assert_close(cached.mask_weights(cached.samples[0].mask_key), torch.full((16, 16), 76 / 255))


def test_a_mask_cropped_away_entirely_is_refused_at_caching(encoder, tmp_path):
    Image.new("RGB", (96, 64), "white").save(tmp_path / "wide.png")
    (tmp_path / "wide.txt").write_text("white")
    mask_image(size=(96, 64), split=12).save(tmp_path / "wide_mask.png")  # white on the 12 left columns: cropped off
    samples = discover(tiny_dataset_config(tmp_path, mask_background_weight=0.0))
    with pytest.raises(UserInputError, match="mask .*wide_mask.png keeps nothing of its image"):
        build_cache(encoder, samples, tmp_path / "cache")
    samples = discover(tiny_dataset_config(tmp_path, mask_background_weight=0.1))  # black still weighs 0.1: trains
    build_cache(encoder, samples, tmp_path / "cache")


def test_an_edit_target_takes_a_mask_and_validation_uses_it(tmp_path):
    """Half masks on the targets (controls take none): at background weight 0 the loss and the validation loss
    differ from background weight 1, whose weights are all ones and so equal no masks, bit for bit."""
    from trainer_core.core.config import EditDataConfig
    from trainer_core.data.edit_dataset import load_edit_dataset
    from trainer_core.families.qwen_image_edit.demo import make_edit_demo_dataset
    from trainer_core.families.qwen_image_edit.tiny import build_tiny_edit_components

    folder = make_edit_demo_dataset(tmp_path / "edit", controls=1)
    for extra in sorted(folder.glob("0[4-7]_*")):  # 4 samples are enough
        extra.unlink()
    names = sorted(p.stem for p in folder.glob("*.txt"))
    settings = EditDataConfig(control_resolution=96)  # the demo's

    def trainer_for(background: float) -> Trainer:
        dataset = load_edit_dataset(tiny_dataset_config(folder, mask_background_weight=background,
                                                        validation_images=1), settings)
        masked = any(folder.glob("*_mask.png"))
        assert all(s.controls and (s.mask is not None) == masked for s in dataset.samples + dataset.validation)
        components = build_tiny_edit_components("edit-2511", storage="float32")
        cached = build_cache(components, list(dataset.samples), tmp_path / "cache", validation=list(dataset.validation),
                             settings=settings)
        return make_trainer(components, cached)

    def losses(trainer: Trainer) -> tuple[torch.Tensor, float]:
        with torch.no_grad():
            return trainer.built.flow.loss(trainer.built.flow.draw(0, indices=[0, 1])), trainer.validation_loss()

    bare = losses(trainer_for(0.0))
    for name in names:
        mask_image().save(folder / f"{name}_mask.png")
    mask_image().save(folder / f"{names[0]}_control_mask.png")
    with pytest.raises(UserInputError, match="mask .*_control_mask.png belongs to the control image"):
        trainer_for(0.0)
    (folder / f"{names[0]}_control_mask.png").unlink()
    ignored, ones = losses(trainer_for(0.0)), losses(trainer_for(1.0))
    assert torch.equal(ones[0], bare[0]) and ones[1] == bare[1]
    assert not torch.equal(ignored[0], bare[0]) and ignored[1] != bare[1]  # validation weighs by the masks too


def test_the_dataset_node_sees_an_edited_mask_in_the_masks_folder(pack, plain, tmp_path):
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRADataset"]
    folder = masked_copy(plain, tmp_path / "node", {"img0": mask_image()}, subfolder=True)
    before = node.IS_CHANGED(folder=str(folder))
    mask_image(split=16).save(folder / "masks" / "img0.png")
    assert node.IS_CHANGED(folder=str(folder)) != before  # ComfyUI runs the Dataset node again
