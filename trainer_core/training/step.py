"""One micro-batch of training: draw it (samples, noise, noise levels, caption dropout), then its flow loss.

    batch = step.draw(m)              # MicroBatch m of the run, its draws from training/randomness.py
    loss = step.loss(batch)           # a 0-dim fp32 tensor, graph attached; the recipe calls backward

Shapes: latents x0 and noise (B, C, h, w) with h, w the latent grid (pixels / VAE factor); B samples of one
bucket (the data order's grouping). The transformer sees the packed noisy latents (B, N = h/2 * w/2, 4C)
(2 = PATCH_SIZE), the prompt embeddings padded to (B, L, D) with their mask (B, L), the noise levels (B,) as
its timestep and one `img_shapes` entry list per sample; the loss covers the target's N tokens.

What differs between model families (Edit: control latents after the target's tokens, the empty caption
seen with the sample's own controls) is asked of the model set's family (families/base.ModelFamily):
`dropped_text_key`, `conditions`, `token_grid`, `pack`, `resolution_mu`, `transformer_inputs`,
`transformer_kwargs`, `loss_tokens`; the data order groups by its `batch_group` (setup.py). (Layered's latents
are (B, C, F, h, w): a composite and its layers as frames, packed frame after frame.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.config import TrainConfig
from ..data.cache import CachedDataset, CachedSample
from ..data.order import DataOrder
from ..models.text import pad_prompt_batch
from . import randomness
from .objective import flow_loss, noisy_latents, sample_noise_levels, velocity_target


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
                 scheduler_config: dict, device: torch.device, compute_dtype: torch.dtype, family):
        self.transformer, self.dataset, self.order, self.cfg = transformer, dataset, order, train
        self.family = family  # the model set's (families/base.ModelFamily)
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
        b = latent_shape[0]
        cfg = self.cfg
        mu = self.family.resolution_mu(latent_shape, self.scheduler_config) if cfg.resolution_shift else None
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
        family = self.family
        embeds = [self.dataset.embedding(family.dropped_text_key(self.dataset, s) if drop else s.text_key)
                  for s, drop in zip(batch.samples, batch.dropped.tolist())]
        return self.flow_loss(batch.x0, batch.noise, batch.levels, embeds, family.conditions(self.dataset, batch.samples))

    def flow_loss(self, x0: torch.Tensor, noise: torch.Tensor, levels: torch.Tensor, embeds: list[torch.Tensor],
                  conditions: list[list[torch.Tensor]] | None = None) -> torch.Tensor:
        """The flow-matching loss of latents x0 (B, C, h, w) at noise levels (B,) with this noise and these
        prompt embeddings [(L_i, D)], one per latent. `conditions`: per latent its condition latents, or None."""
        family = self.family
        grid = family.token_grid(x0.shape)
        text, text_mask = pad_prompt_batch(embeds)  # (B, L, D), (B, L) or None
        hidden = family.pack(noisy_latents(x0, noise, levels)).to(self.device, self.compute_dtype)  # (B, N, 4C)
        hidden, img_shapes = family.transformer_inputs(hidden, grid, conditions)  # (B, N + M, 4C): M condition tokens
        prediction = self.transformer(
            hidden_states=hidden,
            encoder_hidden_states=text.to(self.device, self.compute_dtype),
            encoder_hidden_states_mask=None if text_mask is None else text_mask.to(self.device),
            timestep=levels.to(self.device, self.compute_dtype),
            img_shapes=img_shapes,
            return_dict=False,
            **family.transformer_kwargs(x0.shape[0], self.device),
        )[0][:, : family.loss_tokens(grid)]  # (B, N, 4C): the loss covers the target's tokens only
        target = family.pack(velocity_target(x0, noise)).to(self.device)
        return flow_loss(prediction, target)
