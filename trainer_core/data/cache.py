"""Latent and prompt-embedding cache on disk, addressed by content, for every model family.

A latent's key hashes the image bytes, its bucket, the crop recipe and the VAE's fingerprint; a prompt
embedding's key is the family's (families/base.CacheConditioning: text-to-image hashes the text, the text
encoder's fingerprint, tokenizer included, and the template; Edit adds the control images the prompt is
seen with), and so are the keys and encoding of a sample's condition latents (Edit: its control images).
So a second run over the same data encodes nothing, a changed image is re-encoded alone, and a cache
written by another model simply misses. Files are safetensors written atomically (temp + rename); the
temporary files of a killed run are removed when the cache is next built.

Every image and every prompt is encoded alone (a batch of one): a latent computed beside others differs in
the last bits with its batch companions, and a cache must not depend on which entries a killed run had
written already. A cache built across a kill therefore equals, bit for bit, one built in one go.

Layout: <cache_dir>/latents/<key>.safetensors  {"latents": (C, h, w) fp32}
        <cache_dir>/text/<key>.safetensors     {"embedding": (L, D)}
        <cache_dir>/masks/<key>.safetensors    {"weights": (h, w) fp32}: a masked image's loss weights on its
                                               latent grid (masks.py), keyed by the mask's bytes, its image's
                                               size and bucket, the VAE and the background weight; an edited
                                               mask makes a new entry (its image's latent stays cached)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from ..core.errors import UserInputError
from ..core.files import check_path_room, os_error, remove_leftovers, write_error, write_safetensors_atomic
from ..models.components import CachingWork, QwenImageComponents
from ..models.latents import encode_images
from .images import Sample, load_cropped
from .masks import loss_weights, mask_key
from .preservation import class_captions

# Bump when the way latents or embeddings are produced changes: old entries then miss.
# 2: every image and prompt encoded alone (1 encoded them in batches, so entries depended on their companions).
CACHE_VERSION = "2"
# Cache entries' file names; `.<name>.PID.tmp` beside them is a killed write's leftover.
ENTRY_NAME = r"[0-9a-f]{32}\.safetensors"
# A bare safetensors temporary file this old (seconds) is a killed write's, not another run's in progress.
LIBRARY_TEMP_AGE = 600.0
CROP_RECIPE = "cover-lanczos-centre-crop"


@dataclass(frozen=True)
class CachedSample:
    """One sample's cache entries. Every family's samples have these fields (the step never probes); the
    condition fields are empty for a family without conditions."""

    latent_key: str
    text_key: str
    bucket: tuple[int, int]  # (width, height) in pixels
    caption: str
    image_path: str
    empty_text_key: str = ""  # the empty caption as the sample's conditions see it (caption dropout)
    condition_keys: tuple[str, ...] = ()  # latent keys of its conditions, in order (Edit: the control images)
    condition_sizes: tuple[tuple[int, int], ...] = ()  # (width, height) px of each condition's VAE image
    condition_paths: tuple[str, ...] = ()  # their files (for status text)
    mask_key: str = ""  # key of its loss weights (masks/), or "": no mask, every latent position weighs 1
    dataset: str = ""  # the label of the dataset it came from (images.Sample.dataset)
    loss_weight: float = 1.0  # its dataset's loss weight
    regularization: bool = False  # from a regularisation dataset
    # Differential output preservation: the key of its class caption (the trigger replaced by the class word,
    # data/preservation.py); "" when the sample takes no part.
    preservation_text_key: str = ""


@dataclass
class CacheReport:
    latents_encoded: int = 0
    latents_reused: int = 0
    prompts_encoded: int = 0
    prompts_reused: int = 0
    masks_made: int = 0
    masks_reused: int = 0

    def summary(self) -> str:
        masks = (f"; masks: {self.masks_made} made, {self.masks_reused} from cache"
                 if self.masks_made or self.masks_reused else "")
        return (f"latents: {self.latents_encoded} encoded, {self.latents_reused} from cache; "
                f"prompts: {self.prompts_encoded} encoded, {self.prompts_reused} from cache{masks}")


@dataclass
class CachedDataset:
    """What the trainer needs: sample entries, prompt keys, and lazy access to the cached tensors."""

    cache_dir: Path
    samples: list[CachedSample]
    prompt_keys: dict[str, str]  # prompt text -> text key (preview prompts, negative prompt, "")
    vae_fingerprint: str
    text_fingerprint: str
    family: str  # the name of the family whose conditioning made the entries
    repeats: int | tuple[int, ...] = 1  # per epoch: one number for all samples, or one per sample
    preview_prompts: list[str] = field(default_factory=list)
    negative_prompt: str = ""
    # Held out of training (never in the data order): the validation loss is measured on these.
    validation: list[CachedSample] = field(default_factory=list)
    report: CacheReport = field(default_factory=CacheReport)
    # Whose conditions the preview and negative prompts were encoded with (the first training sample).
    preview_sample: CachedSample | None = None
    settings: object = None  # the family's data settings the cache was built with (Edit: EditDataConfig)
    _memory: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict, repr=False)

    def latents(self, key: str) -> torch.Tensor:
        """(C, h, w) normalised latents."""
        return self._read("latents", key, "latents")

    def embedding(self, key: str) -> torch.Tensor:
        """(L, D) prompt embedding."""
        return self._read("text", key, "embedding")

    def text_tensor(self, key: str, name: str) -> torch.Tensor:
        """Another tensor a family cached beside a prompt's embedding (Qwen-Image 2.1: "image_slots" (L,))."""
        return self._read("text", key, name)

    def mask_weights(self, key: str) -> torch.Tensor:
        """(h, w) fp32 loss weights of a masked sample (`CachedSample.mask_key`)."""
        return self._read("masks", key, "weights")

    def prompt_embedding(self, prompt: str) -> torch.Tensor:
        if prompt not in self.prompt_keys:
            known = [p for p in self.prompt_keys if p]
            raise KeyError(prompt, known)
        return self.embedding(self.prompt_keys[prompt])

    def _read(self, kind: str, key: str, tensor_name: str) -> torch.Tensor:
        memo = (key, tensor_name)  # one entry may hold several tensors (text_tensor)
        if memo not in self._memory:
            path = self.cache_dir / kind / f"{key}.safetensors"
            try:
                self._memory[memo] = load_file(str(path))[tensor_name]
            except (OSError, SafetensorError, KeyError) as e:  # deleted, moved or overwritten while in use
                error = os_error(e)
                reason = ("missing" if isinstance(e, FileNotFoundError)
                          else error.strerror if error is not None and error.strerror else e)
                raise UserInputError(
                    f"the cache entry {path} cannot be read ({reason}): the "
                    "cache folder was changed or deleted while this run used it. Run the Cache node again (or "
                    "restore the folder): only the missing entries are encoded.") from None
        return self._memory[memo]


def latent_key(sample: Sample, vae_fingerprint: str) -> str:
    parts = (CACHE_VERSION, CROP_RECIPE, sample.image_sha256, f"{sample.bucket[0]}x{sample.bucket[1]}", vae_fingerprint)
    if sample.decode:  # transparency (its background) or high-bit grey: decoded differently from plain images
        parts += (sample.decode,)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _entry_ok(path: Path, tensor_name: str) -> bool:
    """An entry counts only if it is complete: a cut-short file (full disk, crash) is re-encoded."""
    if not path.is_file():
        return False
    try:
        with safe_open(str(path), framework="pt") as f:  # reads the header and checks the file's length
            return tensor_name in f.keys()
    except (SafetensorError, OSError, ValueError):
        return False


# The most an entry's write adds to the cache folder's path: "/latents/", the temporary folder it is written in
# (files._replacing: ".NAME.PID.tmp/"), the entry's name, and safetensors' own temporary suffix (".tmpXXXXXX").
_ENTRY = len("0" * 32 + ".safetensors")
ENTRY_ROOM = len("/latents/") + len(".") + _ENTRY + len(".4194304.tmp/") + _ENTRY + len(".tmpXXXXXX")


# The longest prompt the pipelines encode (Qwen-Image's and 2.1's max_sequence_length): longer ones are cut there.
MAX_PROMPT_TOKENS = 1024


def caching_work(prompt_jobs: dict[str, tuple[str, Sample]], conditioning) -> CachingWork:
    """What encoding `prompt_jobs` asks of the text encoder at most: the longest prompt's UTF-8 bytes (a byte-level
    BPE token holds at least one: an upper bound of its tokens), and the images of the sample whose conditions are
    largest (its prompt is encoded with them: Edit's controls, 2.1's references)."""
    tokens = min(MAX_PROMPT_TOKENS, max(len(prompt.encode()) for prompt, _ in prompt_jobs.values()))
    sizes = [tuple(conditioning.entry_fields(s).get("condition_sizes", ())) for _, s in prompt_jobs.values() if s]
    largest = max(sizes, key=lambda z: sum(w * h for w, h in z), default=())
    return CachingWork(text_tokens=tokens, image_sizes=largest)


def build_cache(
    components: QwenImageComponents,
    samples: list[Sample],
    cache_dir: str | Path,
    preview_prompts: list[str] = (),
    negative_prompt: str = "",
    batch_size: int = 4,  # entries per progress update (each is encoded alone)
    repeats: int | tuple[int, ...] = 1,
    progress: Callable[[int, int], None] | None = None,
    validation: list[Sample] = (),
    settings=None,
    preservation: tuple[str, str] | None = None,
) -> CachedDataset:
    """Encode what is not cached yet, then release the text encoder and park the VAE on the CPU.

    The model set's family (`components.family`) says how prompts and conditions are keyed and encoded;
    `settings` are its data settings (`family.data_settings(dataset)`; None: its defaults). Per sample its
    caption and the empty caption (caption dropout) are encoded, and the preview prompts, the negative
    prompt and the empty prompt as the first training sample's conditions see them. `validation` samples
    (held out of training) are cached the same way. `preservation`: (trigger, class word) of differential output
    preservation (CacheConfig): the class captions of the training samples with the trigger are encoded too.
    """
    family = components.family  # handed by the families' loaders (this layer imports none)
    cache_dir = Path(cache_dir)
    check_path_room(cache_dir, "cache folder", ENTRY_ROOM)  # (a Cache node's name is checked so by files.inside)
    training, validation = list(samples), list(validation)
    everything = training + validation
    vae_fp = components.fingerprint("vae")
    conditioning = family.cache_conditioning(components, everything, settings)  # refuses what it cannot take
    family.check_transparency(everything)
    for kind in ("latents", "text", "masks"):  # what killed runs left (only we write these folders)
        remove_leftovers(cache_dir / kind, names=ENTRY_NAME, library_temps_older_than=LIBRARY_TEMP_AGE)

    preview = training[0] if training else None
    trigger, class_word = preservation or ("", "")
    class_texts = class_captions(training, trigger, class_word) if trigger.strip() else [None] * len(training)
    prompt_jobs: dict[str, tuple[str, Sample]] = {}  # key -> (prompt, the sample whose conditions it sees)
    for s, class_text in zip(everything, [*class_texts, *[None] * len(validation)]):
        for prompt in (s.caption, "", *([class_text] if class_text is not None else [])):
            prompt_jobs.setdefault(conditioning.text_key(prompt, s), (prompt, s))
    # Prompts a preview can use without the text encoder: those cached as the preview sample sees them.
    prompt_keys: dict[str, str] = {}
    fixed = (*preview_prompts, negative_prompt, "")
    for prompt in dict.fromkeys([*(s.caption for s in everything), *fixed]):
        key = conditioning.text_key(prompt, preview)
        if prompt in fixed or key in prompt_jobs:
            prompt_jobs.setdefault(key, (prompt, preview))
            prompt_keys[prompt] = key
    condition_jobs = {k: v for s in everything for k, v in conditioning.condition_jobs(s).items()}
    mask_keys = {s.image_path: mask_key(s.mask, (s.width, s.height), s.bucket, vae_fp, CACHE_VERSION)
                 for s in everything if s.mask is not None}

    def exists(kind: str, key: str, name: str) -> bool:
        return _entry_ok(cache_dir / kind / f"{key}.safetensors", name)

    todo_targets = [s for s in everything if not exists("latents", conditioning.target_key(s, vae_fp), "latents")]
    todo_conditions = {k: v for k, v in condition_jobs.items() if not exists("latents", k, "latents")}
    todo_prompts = {k: v for k, v in prompt_jobs.items() if not exists("text", k, "embedding")}
    todo_masks = {mask_keys[s.image_path]: s for s in everything
                  if s.mask is not None and not exists("masks", mask_keys[s.image_path], "weights")}
    total, done = len(todo_targets) + len(todo_conditions) + len(todo_prompts) + len(todo_masks), 0

    def write(tensors: dict[str, torch.Tensor], kind: str, key: str, what: str, metadata=None) -> None:
        nonlocal done
        try:
            write_safetensors_atomic(tensors, cache_dir / kind / f"{key}.safetensors", metadata)
        except OSError as e:
            raise write_error(e, f"cache entry of {what}", cache_dir / kind,
                              f"The {done} entries encoded before it are kept: the next run encodes only the rest."
                              ) from None
        done += 1
        if progress and (done % batch_size == 0 or done == total):
            progress(done, total)

    if todo_targets or todo_conditions:
        vae = components.ensure_vae()
        for s in todo_targets:  # alone: see the module docstring
            latent = conditioning.encode_target(s)  # the family's own targets (Layered: (C, F, h, w)), or None
            if latent is None:
                pixels = load_cropped(s.image_path, s.bucket, s.background, s.allow_large_images).unsqueeze(0)  # (1, 3, H, W)
                latent = encode_images(vae, pixels)[0]  # (C, h, w)
            write({"latents": latent}, "latents", conditioning.target_key(s, vae_fp), f"image {Path(s.image_path).name}",
                  {"image": Path(s.image_path).name, "bucket": f"{s.bucket[0]}x{s.bucket[1]}"})
        conditioning.encode_conditions(todo_conditions, write)
    for key, s in todo_masks.items():  # on the grid of the image's latent, cached by now (no VAE needed)
        target = conditioning.target_key(s, vae_fp)
        with safe_open(str(cache_dir / "latents" / f"{target}.safetensors"), framework="pt") as f:
            grid = tuple(f.get_slice("latents").get_shape()[-2:])  # (h, w)
        write({"weights": loss_weights(s.mask, (s.width, s.height), s.bucket, grid)}, "masks", key,
              f"mask {Path(s.mask.path).name}", {"mask": Path(s.mask.path).name, "image": Path(s.image_path).name})
    if todo_prompts:
        components.ensure_text_encoder(caching_work(todo_prompts, conditioning))
        conditioning.encode_prompts(todo_prompts, write)
    components.release_text_encoder()
    components.release_vae()

    def entry(s: Sample, class_text: str | None = None) -> CachedSample:
        return CachedSample(latent_key=conditioning.target_key(s, vae_fp), text_key=conditioning.text_key(s.caption, s),
                            bucket=s.bucket, caption=s.caption, image_path=s.image_path,
                            empty_text_key=conditioning.text_key("", s), mask_key=mask_keys.get(s.image_path, ""),
                            **conditioning.entry_fields(s),
                            dataset=s.dataset, loss_weight=s.loss_weight, regularization=s.regularization,
                            preservation_text_key="" if class_text is None else conditioning.text_key(class_text, s))

    report = CacheReport(
        latents_encoded=len(todo_targets) + len(todo_conditions),
        latents_reused=len(everything) + len(condition_jobs) - len(todo_targets) - len(todo_conditions),
        prompts_encoded=len(todo_prompts), prompts_reused=len(prompt_jobs) - len(todo_prompts),
        masks_made=len(todo_masks), masks_reused=len(set(mask_keys.values())) - len(todo_masks))
    return CachedDataset(
        cache_dir=cache_dir, samples=[entry(s, c) for s, c in zip(training, class_texts)],
        validation=[entry(s) for s in validation],
        prompt_keys=prompt_keys, vae_fingerprint=vae_fp, text_fingerprint=components.fingerprint("text_encoder"),
        repeats=repeats, preview_prompts=list(preview_prompts), negative_prompt=negative_prompt, report=report,
        family=family.name, preview_sample=entry(preview) if preview is not None else None, settings=settings)
