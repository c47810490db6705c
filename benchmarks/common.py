"""Shared by the benchmark scripts: a synthetic, in-memory training set for any transformer config.

The trainer reads latents and prompt embeddings through a `CachedDataset`; here its in-memory table is
filled directly with random tensors of the right shapes, so the real `Trainer` runs with no VAE, no text
encoder and no files (what matters for speed and memory is shapes, not values).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from trainer_core.data.cache import CachedDataset, CachedSample  # noqa: E402
from trainer_core.families.qwen_image import QWEN_IMAGE  # noqa: E402
from trainer_core.models.components import QwenImageComponents  # noqa: E402
from trainer_core.models.scheduler import QWEN_IMAGE_SCHEDULER_CONFIG  # noqa: E402


def synthetic_setup(transformer: torch.nn.Module, samples: int, latent_hw: tuple[int, int], text_tokens: int,
                    device: torch.device, compute_dtype: torch.dtype, seed: int = 1234,
                    storage: str = "float8") -> tuple[QwenImageComponents, CachedDataset]:
    """Components around `transformer` and a dataset of `samples` random latents (C, h, w) and prompt
    embeddings (text_tokens, joint dim), all in one bucket.

    `seed` must differ from the trainer's: with equal seeds the trainer's first noise draw equals the
    first latent, the first target (noise - latent) is zero and the first loss meaningless."""
    cfg = transformer.config
    channels = cfg.in_channels // cfg.patch_size ** 2
    g = torch.Generator().manual_seed(seed)
    memory, entries = {}, []
    for i in range(samples):
        # The cache's in-memory entries are keyed (entry key, tensor name), as CachedDataset._read reads them.
        memory[(f"latent{i}", "latents")] = torch.randn(channels, *latent_hw, generator=g)  # (C, h, w) fp32, as cached
        memory[(f"text{i}", "embedding")] = torch.randn(text_tokens, cfg.joint_attention_dim, generator=g).to(compute_dtype)
        entries.append(CachedSample(latent_key=f"latent{i}", text_key=f"text{i}", bucket=(latent_hw[1] * 8, latent_hw[0] * 8),
                                    caption=f"sample {i}", image_path=f"synthetic/{i}.png"))
    memory[("text-empty", "embedding")] = torch.zeros(text_tokens, cfg.joint_attention_dim).to(compute_dtype)
    dataset = CachedDataset(cache_dir=Path("synthetic"), samples=entries, prompt_keys={"": "text-empty"},
                            vae_fingerprint="synthetic", text_fingerprint="synthetic", family=QWEN_IMAGE.name,
                            _memory=memory)
    components = QwenImageComponents(
        transformer=transformer, vae=None, text_encoder=None, tokenizer=None,
        scheduler_config=dict(QWEN_IMAGE_SCHEDULER_CONFIG), compute_dtype=compute_dtype, device=device,
        name="synthetic", storage=storage, family=QWEN_IMAGE)
    return components, dataset


def resident_bytes(trainer) -> int:
    """CPU stand-in for allocated memory before the steps: the model's tensors (parameters, buffers, RoPE
    tables) that are in use, plus the swapper's slots (the masters of swapped blocks are host memory). Each
    tensor's own bytes, not its storage's: a block that an earlier setting swapped computes from a view into
    that setting's arena, whose whole chunk is not this model's."""
    model = trainer.built.transformer
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers(), model.pos_embed.pos_freqs, model.pos_embed.neg_freqs]:
        if t.numel():
            key = (t.data_ptr(), t.numel())
            if key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
    swapper = trainer.built.runner.swapper
    return total + (swapper.slot_bytes if swapper is not None else 0)
