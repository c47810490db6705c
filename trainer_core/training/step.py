"""One micro-batch of training: draw it (samples, noise, noise levels, caption dropout), then its flow loss.

    batch = step.draw(m)              # MicroBatch m of the run, its draws from training/randomness.py
    loss = step.loss(batch)           # a 0-dim fp32 tensor, graph attached; the recipe calls backward

The loss is the flow loss, weighted per dataset (weighting.py), plus differential output preservation's term
when it is on (preservation.py).

Shapes: latents x0 and noise (B, C, h, w) with h, w the latent grid (pixels / VAE factor); B samples of one
bucket (the data order's grouping). The transformer sees the packed noisy latents (B, N = h/2 * w/2, 4C)
(2 = the family's patch_size), the prompt embeddings padded to (B, L, D) with their mask (B, L), the noise levels (B,) as
its timestep and one `img_shapes` entry list per sample; the loss covers the target's N tokens.

What differs between model families (Edit: control latents after the target's tokens, the empty caption
seen with the sample's own controls) is asked of the model set's family (families/base.ModelFamily):
`patch_size`, `dropped_text_key`, `conditions`, `token_grid`, `pack`, `resolution_mu`, `transformer_kwargs` (by
default from `transformer_inputs` and `extra_transformer_kwargs`), `target_prediction` (by default the leading
`loss_tokens`); the data order groups by its `batch_group` (setup.py). (Layered's latents are (B, C, F, h, w): a
composite and its layers as frames, packed frame after frame.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.config import TrainConfig
from ..data.cache import CachedDataset, CachedSample
from ..data.order import DataOrder
from ..models.text import pad_prompt_batch
from . import randomness
from .masked_loss import batch_weights, masked_flow_loss, packed_weights
from .objective import flow_loss, noisy_latents, sample_noise_levels, velocity_target
from .preservation import base_prediction, preservation_loss, preserved_rows
from .weighting import DatasetLosses, per_sample_losses, sample_weighted_loss, sample_weights


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
        """The timestep micro-batch `number`'s training forward will hand the transformer (as `loss` does), for
        the block runner's modulation ahead: (B,), or (B + P,) with preservation's P rows after the B."""
        samples = [self.dataset.samples[i] for i in self.order.batch(number)]
        shape = (len(samples), *self.dataset.latents(samples[0].latent_key).shape)
        levels = self.noise_levels(number, torch.Size(shape))
        rows = preserved_rows(samples, self.cfg.preservation_weight)
        if rows:
            levels = torch.cat([levels, levels[rows]])
        return levels.to(self.device, self.compute_dtype)

    # -- the loss ----------------------------------------------------------------------------------

    def loss(self, batch: MicroBatch, tally: DatasetLosses | None = None) -> torch.Tensor:
        """The micro-batch's training loss: the flow loss, weighted per latent position by loss masks
        (masked_loss.py) and per sample by its dataset's weight (weighting.py), plus differential output
        preservation's term when it is on (preservation.py). `tally`: gets each sample's flow loss."""
        family, dataset, b = self.family, self.dataset, len(batch.samples)
        keys = [family.dropped_text_key(dataset, s) if drop else s.text_key
                for s, drop in zip(batch.samples, batch.dropped.tolist())]
        embeds = [dataset.embedding(k) for k in keys]
        conditions = family.conditions(dataset, batch.samples)
        masks = batch_weights(dataset, batch.samples, tuple(batch.x0.shape[-2:]))  # (B, h, w) or None
        weights = sample_weights(batch.samples)  # (B,) or None
        rows = preserved_rows(batch.samples, self.cfg.preservation_weight)
        if weights is None and not rows and tally is None:  # the plain (or masked) flow loss, as it always was
            return self.flow_loss(batch.x0, batch.noise, batch.levels, embeds, conditions, masks, text_keys=keys)
        x0, noise, levels = batch.x0, batch.noise, batch.levels
        if rows:  # the base model first, alone (no gradient); then the class captions ride after the B rows
            class_keys = [batch.samples[i].preservation_text_key for i in rows]
            class_embeds = [dataset.embedding(k) for k in class_keys]
            class_conditions = None if conditions is None else [conditions[i] for i in rows]
            base = base_prediction(self.transformer, self.predict, x0[rows], noise[rows], levels[rows], class_embeds,
                                   class_conditions, class_keys)  # (P, N, p*p*C)
            x0, noise, levels = (torch.cat([t, t[rows]]) for t in (x0, noise, levels))
            embeds, keys = embeds + class_embeds, keys + class_keys
            conditions = None if conditions is None else conditions + class_conditions
        prediction = self.predict(x0, noise, levels, embeds, conditions, keys)  # (B + P, N, p*p*C)
        target = self.target(batch.x0, batch.noise)  # (B, N, p*p*C)
        trained = prediction[:b]
        packed = None if masks is None else packed_weights(masks, tuple(batch.x0.shape), family.pack)
        loss = sample_weighted_loss(trained, target, weights, packed)
        if tally is not None:
            tally.add(batch.samples, per_sample_losses(trained.detach(), target, packed))
        if rows:
            loss = loss + preservation_loss(prediction[b:], base, b, self.cfg.preservation_weight)
        return loss

    def flow_loss(self, x0: torch.Tensor, noise: torch.Tensor, levels: torch.Tensor, embeds: list[torch.Tensor],
                  conditions: list[list[torch.Tensor]] | None = None, weights: torch.Tensor | None = None,
                  text_keys: list[str] | None = None) -> torch.Tensor:
        """The flow-matching loss of latents x0 (B, C, h, w) at noise levels (B,) with this noise and these
        prompt embeddings [(L_i, D)], one per latent (`text_keys`: their cache keys, when known).
        `conditions`: per latent its condition latents, or None. `weights`: (B, h, w) loss weights per latent
        position (loss masks, masked_loss.py), or None: the mean."""
        prediction = self.predict(x0, noise, levels, embeds, conditions, text_keys)  # (B, N, p*p*C)
        target = self.target(x0, noise)
        if weights is not None:
            return masked_flow_loss(prediction, target, packed_weights(weights, tuple(x0.shape), self.family.pack))
        return flow_loss(prediction, target)

    def target(self, x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The velocity target (B, N, p*p*C) of the target's N tokens, on the device."""
        return self.family.pack(velocity_target(x0, noise)).to(self.device)

    def predict(self, x0: torch.Tensor, noise: torch.Tensor, levels: torch.Tensor, embeds: list[torch.Tensor],
                conditions: list[list[torch.Tensor]] | None = None, text_keys: list[str] | None = None) -> torch.Tensor:
        """The transformer's velocity prediction (B, N, p*p*C) for the target's N tokens at x_t of x0 (B, C, h, w),
        noise and levels (B,), with these prompt embeddings [(L_i, D)] and conditions (as `flow_loss`)."""
        family = self.family
        grid = family.token_grid(x0.shape)
        text, text_mask = pad_prompt_batch(embeds)  # (B, L, D), (B, L) or None
        hidden = family.pack(noisy_latents(x0, noise, levels)).to(self.device, self.compute_dtype)  # (B, N, p*p*C)
        kwargs = family.transformer_kwargs(  # Edit: M condition tokens after the target's N
            hidden, grid, conditions, text.to(self.device, self.compute_dtype),
            None if text_mask is None else text_mask.to(self.device), text_keys, self.dataset)
        output = self.transformer(**kwargs, timestep=levels.to(self.device, self.compute_dtype), return_dict=False)[0]
        return family.target_prediction(output, grid)  # (B, N, p*p*C): the loss covers the target's tokens only
