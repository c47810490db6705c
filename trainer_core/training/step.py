"""One micro-batch of training: draw it (samples, noise, noise levels, caption dropout), then its flow loss.

    batch = step.draw(m)              # MicroBatch m of the run, its draws from training/randomness.py
    loss = step.loss(batch)           # a 0-dim fp32 tensor, graph attached; the recipe calls backward

Shapes: latents x0 and noise (B, C, h, w) with h, w the latent grid (pixels / VAE factor); B samples of one
bucket (the data order's grouping). The transformer sees the packed noisy latents (B, N = h/2 * w/2, 4C)
(2 = PATCH_SIZE), the prompt embeddings padded to (B, L, D) with their mask (B, L), the noise levels (B,) as
its timestep and one `img_shapes` entry list per sample; the loss covers the target's N tokens.

What differs for Qwen-Image-Edit (control latents after the target's tokens, the empty caption seen with
the sample's own controls) enters through the hooks at the bottom of this file.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache import CachedDataset, CachedSample
from ..batching import DataOrder
from ..config import TrainConfig
from ..edit.cache import sample_controls  # Qwen-Image-Edit's conditions (trainer_core/edit/)
from ..edit.objective import append_controls
from ..models.latents import pack_latents
from ..models.qwen_arch import PATCH_SIZE
from ..models.text import pad_prompt_batch
from ..objective import flow_loss, noisy_latents, resolution_mu, sample_noise_levels, velocity_target
from . import randomness


@dataclass
class MicroBatch:
    """Micro-batch `number` of the run (counted over all processes) with its random draws, on the CPU."""

    number: int
    samples: list[CachedSample]
    x0: torch.Tensor  # (B, C, h, w) clean latents, fp32
    noise: torch.Tensor  # (B, C, h, w) standard normal
    levels: torch.Tensor  # (B,) noise levels s in (0, 1), after the resolution shift
    dropped: torch.Tensor  # (B,) bool: the caption is replaced by the empty one


class FlowMatchingStep:
    """Draws micro-batches and computes their loss for one trainer (its transformer, dataset and settings)."""

    def __init__(self, transformer: torch.nn.Module, dataset: CachedDataset, order: DataOrder, train: TrainConfig,
                 scheduler_config: dict, device: torch.device, compute_dtype: torch.dtype):
        self.transformer, self.dataset, self.order, self.cfg = transformer, dataset, order, train
        self.scheduler_config = scheduler_config
        self.device, self.compute_dtype = device, compute_dtype

    # -- drawing ---------------------------------------------------------------------------------

    def draw(self, number: int, indices: list[int] | None = None) -> MicroBatch:
        """Micro-batch `number` of the run: the data order's samples for it (or the samples `indices`, to score
        chosen samples with that micro-batch's draws)."""
        samples = [self.dataset.samples[i] for i in (self.order.batch(number) if indices is None else indices)]
        x0 = torch.stack([self.dataset.latents(s.latent_key) for s in samples]).float()  # (B, C, h, w)
        seed = self.cfg.seed
        noise = torch.randn(x0.shape, generator=randomness.generator(seed, number, randomness.NOISE))
        dropped = torch.rand(len(samples), generator=randomness.generator(seed, number, randomness.CAPTION_DROPOUT))
        return MicroBatch(number, samples, x0, noise, self.noise_levels(number, x0.shape),
                          dropped < self.cfg.caption_dropout)

    def noise_levels(self, number: int, latent_shape: torch.Size) -> torch.Tensor:
        """(B,) noise levels of micro-batch `number` with latents of `latent_shape` (B, C, h, w): a pure function,
        so modulation ahead can compute a later forward's timesteps without drawing anything else."""
        b, _, h, w = latent_shape
        cfg = self.cfg
        tokens = (h // PATCH_SIZE) * (w // PATCH_SIZE)
        mu = resolution_mu(tokens, self.scheduler_config) if cfg.resolution_shift else None
        rng = randomness.generator(cfg.seed, number, randomness.NOISE_LEVELS)
        return sample_noise_levels(b, rng, cfg.timestep_sampling, cfg.logit_mean, cfg.logit_std, mu)

    def planned_timesteps(self, number: int) -> torch.Tensor:
        """The timestep micro-batch `number`'s forward will hand the transformer (as `loss` does), for the
        block runner's modulation ahead."""
        first = self.dataset.samples[self.order.batch(number)[0]]
        shape = (len(self.order.batch(number)), *self.dataset.latents(first.latent_key).shape)
        return self.noise_levels(number, torch.Size(shape)).to(self.device, self.compute_dtype)

    # -- the loss ----------------------------------------------------------------------------------

    def loss(self, batch: MicroBatch) -> torch.Tensor:
        embeds = [self.dataset.embedding(_dropped_text_key(self.dataset, s) if drop else s.text_key)
                  for s, drop in zip(batch.samples, batch.dropped.tolist())]
        return self.flow_loss(batch.x0, batch.noise, batch.levels, embeds, conditions_of(self.dataset, batch.samples))

    def flow_loss(self, x0: torch.Tensor, noise: torch.Tensor, levels: torch.Tensor, embeds: list[torch.Tensor],
                  conditions: list[list[torch.Tensor]] | None = None) -> torch.Tensor:
        """The flow-matching loss of latents x0 (B, C, h, w) at noise levels (B,) with this noise and these
        prompt embeddings [(L_i, D)], one per latent. `conditions`: per latent its condition latents, or None."""
        b, _, h, w = x0.shape
        grid = (h // PATCH_SIZE, w // PATCH_SIZE)
        text, text_mask = pad_prompt_batch(embeds)  # (B, L, D), (B, L) or None
        hidden = pack_latents(noisy_latents(x0, noise, levels)).to(self.device, self.compute_dtype)  # (B, N, 4C)
        hidden, img_shapes = _transformer_inputs(hidden, grid, conditions)
        prediction = self.transformer(
            hidden_states=hidden,
            encoder_hidden_states=text.to(self.device, self.compute_dtype),
            encoder_hidden_states_mask=None if text_mask is None else text_mask.to(self.device),
            timestep=levels.to(self.device, self.compute_dtype),
            img_shapes=img_shapes,
            return_dict=False,
        )[0][:, : grid[0] * grid[1]]  # (B, N, 4C): the loss covers the target's tokens only
        target = pack_latents(velocity_target(x0, noise)).to(self.device)
        return flow_loss(prediction, target)


# -- what differs between model families: one place for the step's hooks -------------------------------


def batch_group(sample: CachedSample):
    """Samples of one micro-batch are stacked: they share this key (the bucket; Edit: also the controls' sizes)."""
    return getattr(sample, "batch_group", sample.bucket)


def _dropped_text_key(dataset: CachedDataset, sample: CachedSample) -> str:
    # An edit sample drops to the empty caption seen with its own control images (edit/cache.py).
    return getattr(sample, "empty_text_key", "") or dataset.prompt_keys[""]


def conditions_of(dataset: CachedDataset, samples: list[CachedSample]) -> list[list[torch.Tensor]] | None:
    return sample_controls(dataset, samples)


def _transformer_inputs(hidden: torch.Tensor, grid: tuple[int, int], conditions) -> tuple[torch.Tensor, list]:
    """(B, N, 4C) target tokens -> (hidden states, img_shapes): Edit appends its control tokens."""
    if conditions is None:
        return hidden, [[(1, *grid)]] * hidden.shape[0]
    return append_controls(hidden, grid, conditions)  # (B, N + M, 4C)
