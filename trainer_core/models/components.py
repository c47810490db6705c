"""The set of Qwen-Image parts a training run works with, and a cheap identity for each."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class QwenImageComponents:
    """Transformer + VAE + text encoder + tokenizer + scheduler settings.

    The transformer's block Linears may be stored in float8 (see `float8.py`); everything else is in
    `compute_dtype`. `text_encoder` and `tokenizer` become None once prompts are cached and the encoder
    is released; the VAE stays (on the CPU when idle) because previews decode with it.
    """

    transformer: nn.Module
    vae: nn.Module | None
    text_encoder: nn.Module | None
    tokenizer: Any | None
    scheduler_config: dict[str, Any]
    compute_dtype: torch.dtype
    device: torch.device
    name: str = "qwen-image"
    storage: str = "float8"
    # Qwen-Image-Edit (trainer_core/edit/): the model set's `edit.variants.EditVariant`; None for text-to-image.
    edit: Any | None = None
    # Re-creates (text_encoder, tokenizer) after `release_text_encoder`, for a later cache run that
    # meets a new caption; None when the source cannot be read again.
    text_encoder_loader: Callable[[], tuple[nn.Module, Any]] | None = field(default=None, repr=False)
    _fingerprints: dict[str, str] = field(default_factory=dict, repr=False)
    # The trainer whose adapter is in the transformer now (a weak reference; see Trainer._claim_model_set).
    trainer_ref: Callable[[], Any] | None = field(default=None, repr=False, compare=False)

    @property
    def num_blocks(self) -> int:
        return len(self.transformer.transformer_blocks)

    def fingerprint(self, part: str) -> str:
        """Identity of one part ('transformer', 'vae', 'text_encoder'), computed once and remembered.

        The text encoder's identity includes the tokenizer's vocabulary, since both decide the embedding.
        """
        if part not in self._fingerprints:
            module = getattr(self, part)
            if module is None:
                raise RuntimeError(f"the {part} was released; its fingerprint was not taken before")
            extra = b""
            if part == "text_encoder" and self.tokenizer is not None:
                extra = repr(sorted(self.tokenizer.get_vocab().items())).encode()
            self._fingerprints[part] = module_fingerprint(module, extra)
        return self._fingerprints[part]

    def release_text_encoder(self) -> None:
        """Drop the text encoder (after caching): previews use cached prompt embeddings."""
        self.fingerprint("text_encoder")  # keep its identity for cache look-ups
        self.text_encoder = None
        self.tokenizer = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def ensure_text_encoder(self) -> None:
        """Bring the text encoder back (on `device`) if it was released."""
        if self.text_encoder is not None:
            return
        if self.text_encoder_loader is None:
            raise RuntimeError("the text encoder was released and this model set cannot load it again")
        text_encoder, tokenizer = self.text_encoder_loader()
        self.text_encoder = text_encoder.to(self.device).requires_grad_(False).eval()
        self.tokenizer = tokenizer

    def park_vae(self) -> None:
        """Move the VAE to the CPU between uses: it is only needed again to decode previews."""
        if self.vae is not None:
            self.vae.to("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()


@torch.no_grad()
def module_fingerprint(module: nn.Module, extra: bytes = b"", samples_per_tensor: int = 64) -> str:
    """A content identity for a model that costs far less than hashing every weight.

    Hashes every tensor's name, shape and dtype plus `samples_per_tensor` values spread over it. Two
    different trainings or checkpoints of the same architecture differ in effectively every tensor,
    so this catches a swapped model file, while a 20B model is fingerprinted in well under a second.
    """
    h = hashlib.sha256(extra)
    for name, tensor in list(module.state_dict().items()):
        h.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}".encode())
        if tensor.device.type == "meta" or tensor.numel() == 0:
            continue
        flat = tensor.reshape(-1)
        step = max(1, flat.numel() // samples_per_tensor)
        picked = flat[::step][:samples_per_tensor].detach().to("cpu")
        h.update(picked.view(torch.uint8).numpy().tobytes() if picked.element_size() == 1
                 else picked.float().numpy().tobytes())
    return h.hexdigest()[:24]
