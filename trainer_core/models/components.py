"""The set of Qwen-Image parts a training run works with, and a cheap identity for each."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..core.host_memory import give_back_freed_memory


@dataclass(frozen=True)
class CachingWork:
    """What caching will ask of the text encoder (the largest forward), for the placement that streams it: an upper
    bound of a prompt's tokens (its UTF-8 bytes: a byte-level BPE token holds at least one byte), and the (W, H) px of
    the images the largest sample's prompt is encoded with (none for text-to-image)."""

    text_tokens: int = 256
    image_sizes: tuple[tuple[int, int], ...] = ()


@dataclass
class QwenImageComponents:
    """Transformer + VAE + text encoder + tokenizer + scheduler settings.

    The transformer's block Linears may be stored in float8 (see `models/float8/`); everything else is in
    `compute_dtype`.

    A model set read from files is lazy, one part per phase of a run (`single_file.load_single_files`):
    only the headers are read at first, each part's identity comes from its file (`file_identity.py`),
    and a part is None until it is needed:
    - the VAE and the text encoder load when the cache misses (`ensure_vae`, `ensure_text_encoder`) and
      are dropped, from the device and from host memory, when caching ends (`release_text_encoder`,
      `release_vae`); a preview loads the VAE again for its decode and keeps it on the CPU after;
    - the transformer loads at Init Trainer (`ensure_transformer`), streamed from its file tensor by
      tensor straight into the places training keeps it (resident blocks on the device, swapped blocks'
      weights in host memory), and is dropped again when its run is released (`unload_transformer`).
    A model set built in memory (tiny models, a diffusers folder) has every part loaded and no sources.
    """

    transformer: nn.Module | None
    vae: nn.Module | None
    text_encoder: nn.Module | None
    tokenizer: Any | None
    scheduler_config: dict[str, Any]
    compute_dtype: torch.dtype
    device: torch.device
    # What the model set is (families/base.ModelFamily): the engine asks it what differs between families. The
    # loaders of this package read Qwen-Image's files and know no family: the families' loaders hand them theirs.
    family: Any
    name: str  # what status lines call it (its transformer file's name, its folder's, the tiny model's)
    storage: str = "float8"
    # Re-creates (text_encoder, tokenizer) after `release_text_encoder`, for a later cache run that
    # meets a new caption; None when the source cannot be read again.
    text_encoder_loader: Callable[[], tuple[nn.Module, Any]] | None = field(default=None, repr=False)
    # The text encoder's processor without the encoder, for a family whose preview pipeline needs it after
    # `release_text_encoder` (Qwen-Image 2.1: its pipeline reads the template's token counts); None: not needed.
    processor_loader: Callable[[], Any] | None = field(default=None, repr=False)
    # Where the text encoder's tensors go when a file loader reads them for caching (text_encoder_file.Placement: the
    # streamed layers' weights in host memory, the rest on the device): set by the families' loaders from the
    # planner's choice for the device's free memory then (planner.device.CachingPlacement); None: read to the CPU and
    # moved to the device whole. Its `release()`, where it has one, runs when the encoder is dropped.
    text_encoder_placement: Any | None = field(default=None, repr=False)
    # What the caching run now starting asks of the encoder (`ensure_text_encoder`), for that placement.
    caching_work: CachingWork = field(default_factory=CachingWork, repr=False)
    # Reads the VAE again after `release_vae` dropped it (None: the VAE stays, parked on the CPU).
    vae_loader: Callable[[], nn.Module] | None = field(default=None, repr=False)
    # Streams the transformer from its file (transformer_file.TransformerFile); None: always loaded.
    transformer_source: Any | None = field(default=None, repr=False)
    # Identities known without the weights (from the files); others are computed from the weights once.
    _fingerprints: dict[str, str] = field(default_factory=dict, repr=False)
    # The trainer whose adapter is in the transformer now (a weak reference; see Trainer._claim_model_set).
    trainer_ref: Callable[[], Any] | None = field(default=None, repr=False, compare=False)

    def vae_image_channels(self) -> tuple[int, str]:
        """(image channels the VAE takes: 3, or 4 for an RGBA one, and its name for messages), without loading its
        weights (a VAE file's loader read them from its first convolution)."""
        if self.vae is not None:
            return self.vae.config.input_channels, "the VAE"
        return self.vae_loader.config.get("input_channels", 3), f"VAE file {self.vae_loader.file.path}"

    @property
    def block_storage(self) -> str:
        """How the transformer's block Linears are held, for status lines: the storage mode, or "int8 ConvRot (the
        file's)" where a one-byte mode keeps an int8 file's weights as they are (models/streaming.py)."""
        source = self.transformer_source
        if self.storage.startswith("float8") and source is not None and source.int8:
            return "int8 ConvRot (the file's)" if any(source.int8.values()) else "int8 (the file's)"
        return self.storage

    @property
    def num_blocks(self) -> int:
        return len(self.skeleton().transformer_blocks)

    def skeleton(self) -> nn.Module:
        """The transformer's modules, for names, shapes and counts: the model itself when it is loaded, else
        an empty copy on the meta device (no weights read)."""
        if self.transformer is not None:
            return self.transformer
        return self.transformer_source.skeleton()

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
                extra = vocabulary_bytes(self.tokenizer)
            self._fingerprints[part] = module_fingerprint(module, extra)
        return self._fingerprints[part]

    # ----------------------------------------------------------------------------------------------
    # text encoder and VAE: loaded for caching (and the VAE for previews), dropped after

    def release_text_encoder(self) -> None:
        """Drop the text encoder (after caching): previews use cached prompt embeddings."""
        if self.text_encoder is not None:
            self.fingerprint("text_encoder")  # keep its identity for cache look-ups
        release_placement = getattr(self.text_encoder_placement, "release", None)
        if release_placement is not None:  # CachingPlacement: its streams hold the encoder's layers
            release_placement()
        self.text_encoder = None
        self.tokenizer = None
        self.give_memory_back()

    def ensure_text_encoder(self, work: CachingWork | None = None) -> None:
        """Bring the text encoder (and tokenizer) in, on `device` (its streamed layers' weights in host memory, where
        `text_encoder_placement` streams it for `work`), if it is not loaded."""
        if self.text_encoder is not None:
            return
        if self.text_encoder_loader is None:
            raise RuntimeError("the text encoder was released and this model set cannot load it again")
        self.caching_work = work or CachingWork()
        text_encoder, tokenizer = self.text_encoder_loader()
        self.text_encoder = text_encoder.to(self.device).requires_grad_(False).eval()
        self.tokenizer = tokenizer

    def ensure_vae(self) -> nn.Module:
        """The VAE on `device`, read from its file first when it was dropped."""
        if self.vae is None:
            if self.vae_loader is None:
                raise RuntimeError("the VAE was released and this model set cannot load it again")
            self.vae = self.vae_loader().requires_grad_(False).eval()
        return self.vae.to(self.device)

    def park_vae(self) -> None:
        """Between previews: the VAE moves to the CPU (0.24 GiB at the real size, in the memory plan's host RAM
        from Init on), so the next preview does not read its file again."""
        if self.vae is not None:
            self.vae.to("cpu")
            self.give_memory_back()

    def release_vae(self) -> None:
        """After caching and when a run is released: drop the VAE from device and host memory when it can be
        read again (a preview then reads it), else park it on the CPU."""
        if self.vae is None or self.vae_loader is None:
            self.park_vae()
            return
        self.fingerprint("vae")
        self.vae = None
        self.give_memory_back()

    def vae_scale_factor(self) -> int | None:
        """Pixels per latent cell, from the VAE or its file's config; None when neither is at hand."""
        config = self.vae.config if self.vae is not None else getattr(self.vae_loader, "config", None)
        if config is None:
            return None
        downsample = config["temperal_downsample"] if isinstance(config, dict) else config.temperal_downsample
        return 2 ** len(downsample)

    # ----------------------------------------------------------------------------------------------
    # transformer: loaded at Init Trainer, into its training placement

    def ensure_transformer(self, device: torch.device | None = None, host_blocks: Iterable[int] = (),
                           given=None) -> nn.Module:
        """The transformer, streamed from its file when it is not loaded: tensors of the blocks in
        `host_blocks` (their frozen Linear weights: the swapped blocks' masters) stay in host memory,
        everything else goes to `device` (default: the CPU). A loaded transformer is returned as it is.
        `given`: tensors taken instead of read (the machine's shared host copy, `streaming.stream_into`)."""
        if self.transformer is None:
            if self.transformer_source is None:
                raise RuntimeError("the transformer was released and this model set cannot load it again")
            load = self.transformer_source.load
            where = (device or torch.device("cpu"), set(host_blocks))
            self.transformer = load(*where, given=given) if given else load(*where)
        return self.transformer

    @property
    def streams_transformer(self) -> bool:
        """Whether the transformer is still to be read from its file (so a shared host copy can stand in for
        part of the file, `ensure_transformer`'s `given`)."""
        return self.transformer is None and self.transformer_source is not None

    def unload_transformer(self) -> bool:
        """Drop the transformer (device and host memory) when its file can stream it again; False (and the
        transformer kept) otherwise. Only for a transformer no trainer holds."""
        if self.transformer is None or self.transformer_source is None:
            return False
        self.transformer = None
        self.give_memory_back()
        return True

    def loaded_parts(self) -> list[str]:
        """The parts in memory now, e.g. ['transformer', 'tokenizer']."""
        return [part for part in ("transformer", "vae", "text_encoder", "tokenizer") if getattr(self, part) is not None]

    def give_memory_back(self) -> None:
        """After dropping a part: its host memory to the OS, the GPU's cached blocks to the driver."""
        give_back_freed_memory()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def vocabulary_bytes(tokenizer) -> bytes:
    """The tokenizer's vocabulary as bytes, for identities (the same text must map to the same tokens)."""
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor (Qwen-Image 2.1's) wraps its tokenizer
    return repr(sorted(tokenizer.get_vocab().items())).encode()


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
