"""Validation loss: held-out images (cached, never trained on), fixed noise and noise levels, measured every
N steps without touching training, kept across a resume, plotted with the training loss."""

import numpy as np
import pytest
import torch

from conftest import adapter_snapshot, tiny_dataset_config
from trainer_core.data.cache import build_cache
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.data.images import load_dataset, validation_indices
from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.training.plot import VALIDATION, loss_plot
from trainer_core.training import Trainer


def make_trainer(folder, cache_dir, held_out=2, run_dir=None, **train):
    components = build_tiny_components(seed=0, storage="float32")
    dataset = load_dataset(tiny_dataset_config(folder, validation_images=held_out))
    cached = build_cache(components, list(dataset.samples), cache_dir, validation=list(dataset.validation))
    settings = dict(seed=3, micro_batch_size=2, caption_dropout=0.2)
    settings.update(train)
    return Trainer(components, cached, LoraConfig(rank=4, alpha=8.0, targets="all", dropout=0.1),
                   OptimizerConfig(learning_rate=2e-3), TrainConfig(**settings), run_dir=run_dir)


def test_held_out_images_are_spread_named_and_never_trained_on(demo_folder, tiny_cache):
    assert validation_indices(10, 2) == {2, 7} and validation_indices(5, 0) == set()
    full = load_dataset(tiny_dataset_config(demo_folder))
    split = load_dataset(tiny_dataset_config(demo_folder, validation_images=2))
    held = {s.image_path for s in split.validation}
    assert len(held) == 2 and not held & {s.image_path for s in split.samples}
    assert sorted(s.image_path for s in split.samples + split.validation) == [s.image_path for s in full.samples]
    assert all(path.rsplit("/", 1)[-1] in split.summary() for path in held)
    with pytest.raises(UserInputError, match="keep at least one for training"):
        load_dataset(tiny_dataset_config(demo_folder, validation_images=len(full.samples)))

    trainer = make_trainer(demo_folder, tiny_cache)
    trained_on = {trainer.dataset.samples[i].image_path for m in range(20) for i in trainer.built.order.batch(m)}
    assert not trained_on & held  # the data order only ever draws training samples
    for sample in trainer.dataset.validation:  # cached like the training samples: latents and embeddings
        assert (tiny_cache / "latents" / f"{sample.latent_key}.safetensors").is_file()
        assert (tiny_cache / "text" / f"{sample.text_key}.safetensors").is_file()


def test_measuring_validation_changes_nothing_of_training(demo_folder, tiny_cache):
    """Bit-identical LoRA weights and losses with and without validation (LoRA dropout and caption dropout
    on, so the global and the trainer's RNG are both in play)."""
    plain = make_trainer(demo_folder, tiny_cache, validation_every=0)
    checked = make_trainer(demo_folder, tiny_cache, validation_every=2)
    plain.train(6)
    checked.train(3)
    checked.train(3)
    assert plain.progress.loss_history == checked.progress.loss_history
    a, b = adapter_snapshot(plain), adapter_snapshot(checked)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert plain.progress.validation_history == []
    assert [s for s, _ in checked.progress.validation_history] == [2, 4, 6]
    assert checked.built.transformer.training is False  # as train() leaves it


def test_validation_values_are_deterministic(demo_folder, tiny_cache):
    one = make_trainer(demo_folder, tiny_cache, validation_every=3)
    two = make_trainer(demo_folder, tiny_cache, validation_every=3)
    before = one.validation_loss()
    assert one.validation_loss() == before  # same step, same value
    one.train(6)
    two.train(6)
    assert one.progress.validation_history == two.progress.validation_history
    assert one.validation_loss() == one.progress.validation_history[-1][1]  # measured again at step 6: the same
    assert one.progress.validation_history[-1][1] != before  # and it does follow the LoRA


def test_a_resume_keeps_the_validation_curve(demo_folder, tiny_cache, tmp_path):
    first = make_trainer(demo_folder, tiny_cache, run_dir=tmp_path / "run", validation_every=2)
    first.train(4)
    history = list(first.progress.validation_history)
    first.close()
    second = make_trainer(demo_folder, tiny_cache, run_dir=tmp_path / "run", validation_every=2)
    assert second.resume() and second.step == 4
    assert second.progress.validation_history == history
    second.train(2)
    assert [s for s, _ in second.progress.validation_history] == [2, 4, 6]


def test_no_held_out_images_no_validation(demo_folder, tiny_cache):
    trainer = make_trainer(demo_folder, tiny_cache, held_out=0, validation_every=1)
    trainer.train(2)
    assert trainer.progress.validation_history == []


def count(img, colour):
    return int((np.asarray(img) == np.array(colour, dtype=np.uint8)).all(axis=-1).sum())


def test_the_plot_shows_both_series_with_a_legend():
    history = [(s, 1.0 / s) for s in range(1, 41)]
    without = loss_plot(history)
    with_validation = loss_plot(history, validation=[(10, 0.3), (20, 0.2), (30, 0.25), (40, 0.5)])
    assert count(without, VALIDATION) == 0
    assert count(with_validation, VALIDATION) > 50  # the curve, its points and the legend's swatch
    right_half = with_validation.crop((with_validation.width // 2, 0, with_validation.width, 60))
    assert count(right_half, VALIDATION) > 0  # the legend sits top right
