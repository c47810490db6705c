"""Counter-based randomness: every training draw is a pure function of (seed, micro-batch, purpose).

The consequences tested elsewhere (chunks == one call: test_trainer; resume in a new process: test_resume;
2 processes == 1 with 2x accumulation, each drawing only its own micro-batches: test_distributed; modulation
ahead: test_modulation_ahead) rest on what is tested here: a micro-batch's draws do not depend on what was
drawn before it, the counter survives a resume, and a checkpoint of the earlier format is refused by name.
"""

import json

import pytest
import torch

from conftest import cached_demo
from test_trainer import make_trainer
from trainer_core.training import checkpoint
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.training import Trainer, randomness


def trainer_in(run_dir, cache_dir, demo_folder, **train):
    components = build_tiny_components(seed=0, storage="float32")
    cached = cached_demo(components, demo_folder, cache_dir)
    return Trainer(components, cached, LoraConfig(rank=4, alpha=8.0, targets="all", dropout=0.1),
                   OptimizerConfig(learning_rate=1e-3), TrainConfig(seed=3, micro_batch_size=2, **train),
                   run_dir=run_dir)


def test_seeds_differ_by_seed_micro_batch_and_purpose_and_fit_torch():
    seeds = {randomness.counter_seed(s, m, p) for s in (0, 1) for m in (0, 1, 2)
             for p in (randomness.NOISE, randomness.NOISE_LEVELS, randomness.CAPTION_DROPOUT, randomness.LORA_DROPOUT)}
    assert len(seeds) == 2 * 3 * 4
    assert all(0 <= s < 2**63 for s in seeds)
    assert randomness.counter_seed(7, 3, randomness.NOISE) == randomness.counter_seed(7, 3, randomness.NOISE)


def test_a_micro_batchs_draws_do_not_depend_on_what_was_drawn_before(demo_folder, tmp_path):
    """Micro-batch 5 drawn first equals micro-batch 5 drawn after 0..4 (and after sampling from torch's global
    RNG in between): nothing is replayed, nothing is carried from one draw to the next."""
    fresh = make_trainer(tmp_path, demo_folder, caption_dropout=0.5)
    direct = fresh.built.flow.draw(5)
    fresh.close()
    walked = make_trainer(tmp_path, demo_folder, caption_dropout=0.5)
    for m in range(5):
        walked.built.flow.draw(m)
        torch.rand(3)
    after = walked.built.flow.draw(5)
    walked.close()
    assert [s.latent_key for s in direct.samples] == [s.latent_key for s in after.samples]
    for name in ("x0", "noise", "levels", "dropped"):
        assert torch.equal(getattr(direct, name), getattr(after, name)), name
    assert not torch.equal(direct.noise, walked_noise_of(demo_folder, tmp_path, 6))  # another micro-batch: other draws


def walked_noise_of(demo_folder, tmp_path, m):
    t = make_trainer(tmp_path, demo_folder, caption_dropout=0.5)
    try:
        return t.built.flow.draw(m).noise
    finally:
        t.close()


def test_a_checkpoint_of_the_earlier_format_is_refused_naming_both_formats(demo_folder, tmp_path):
    run_dir = tmp_path / "run"
    trainer = trainer_in(run_dir, tmp_path / "cache", demo_folder)
    trainer.train(2)
    trainer.close()
    state = checkpoint.checkpoints_dir(run_dir) / "step_000002" / checkpoint.STATE_JSON
    meta = json.loads(state.read_text())
    meta["format"] = 1
    state.write_text(json.dumps(meta))
    again = trainer_in(run_dir, tmp_path / "cache", demo_folder)
    with pytest.raises(UserInputError, match=r"checkpoint format 1.*format 2.*continue_from_lora"):
        again.resume()
    assert again.step == 0  # nothing was half-loaded
    again.close()


def test_resumed_trainer_continues_the_counter_bit_exactly(demo_folder, tmp_path):
    """In one process (the new-process case is test_resume): 3 + resume + 3 steps == 6 steps."""
    whole = trainer_in(None, tmp_path / "cache", demo_folder, caption_dropout=0.3, grad_accum_steps=2)
    whole.train(6)
    whole_snapshot = {n: p.detach().clone() for n, p in zip(whole.built.param_names, whole.built.params)}
    whole.close()
    first = trainer_in(tmp_path / "run", tmp_path / "cache", demo_folder, caption_dropout=0.3, grad_accum_steps=2)
    first.train(3)
    first.close()
    second = trainer_in(tmp_path / "run", tmp_path / "cache", demo_folder, caption_dropout=0.3, grad_accum_steps=2)
    assert second.resume() and second.progress.micro_batches == 6
    second.train(3)
    assert all(torch.equal(whole_snapshot[n], p) for n, p in zip(second.built.param_names, second.built.params))
    second.close()
