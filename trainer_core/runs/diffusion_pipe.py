"""A diffusion-pipe Qwen-Image config (and the dataset file it names) translated into a run file.

    python -m trainer_core train --from-diffusion-pipe qwen_image.toml [--print-only]

Every field of both files is either mapped onto a run-file key (the printed run file names, beside each value,
the field it came from) or listed as ignored with the reason; a field diffusion-pipe does not read for
Qwen-Image is listed as unknown. A setting that cannot mean the same thing here (another model type, LoKr,
an adapter-less full fine-tune, a model split across files and a diffusers folder) stops with a message.

What diffusion-pipe does and how it carries over (read from its train.py, models/qwen_image.py and
utils/dataset.py): relative paths are taken from the working directory; alpha is always the rank; without
`shift` or `flux_shift` its noise levels are not shifted by image size; images of any size are resized to
their bucket; an image without a caption is skipped (here: an error that names it); its Kahan-summing and
stochastic-rounding optimizers keep bfloat16 LoRA weights from losing small updates: its AdamW with Kahan
summation maps to ours (adamw_kahan), automagic to ours with a float32 LoRA.
"""

from __future__ import annotations

import math
import textwrap
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.config import CacheConfig, OptimizerConfig, field_default, field_meta
from ..core.errors import UserInputError
from .diffusion_pipe_fields import (
    ADAMW_FAMILY,
    AUTOMAGIC_LR,
    AUTOMAGIC_WHY,
    COMPENSATING,
    DATASET_IGNORED,
    GENERIC_IGNORED,
    MAPPED_DATASET_KEYS,
    aspect_range,
    global_batch,
    resolutions,
    shift_text,
)
from .diffusion_pipe_kinds import check_kind
from .run_file import KEYS
from .run_file_toml import render, toml_value


@dataclass
class Translation:
    data: dict[str, Any]  # run-file tables
    comments: dict[tuple, str] = field(default_factory=dict)  # (table, key) / ("dataset", i, key) -> source field
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (diffusion-pipe field = value, why)
    checked: list[str] = field(default_factory=list)  # fields that select what is trained (no run-file key)
    # Every field of both files -> "mapped", "checked" or "ignored" (dataset file: "dataset.<key>",
    # "directory[<n>].<key>").
    accounted: dict[str, str] = field(default_factory=dict)
    source: str = ""
    dataset_file: str = ""

    @property
    def text(self) -> str:
        lines = [f"Run file translated from diffusion-pipe's {self.source}",
                 f"and its dataset file {self.dataset_file}." if self.dataset_file else "",
                 "Each value below names, after it, the diffusion-pipe field it comes from.",
                 *textwrap.wrap(f"Checked: {'; '.join(self.checked)}.", 110, subsequent_indent="  "),
                 "Ignored fields:"]
        for what, why in self.ignored:
            lines += textwrap.wrap(f"{what}: {why}", 110, initial_indent="  ", subsequent_indent="      ")
        if not self.ignored:
            lines.append("  (none)")
        order = {(k.table, k.name): n for n, k in enumerate(KEYS)}
        data = {table: ([_ordered(e, "dataset", order) for e in value] if table == "dataset"
                        else _ordered(value, table, order)) for table, value in self.data.items()}
        return render(data, self.comments, "\n".join(line for line in lines if line))


def translate(config: str | Path, cwd: Path | None = None) -> Translation:
    """Translate diffusion-pipe config `config`; relative paths in it are taken from `cwd` (default: the working
    directory), as diffusion-pipe takes them."""
    try:
        return _Translator(Path(config), cwd or Path.cwd()).run()
    except (ValueError, TypeError, IndexError, KeyError) as e:  # a value of the wrong kind (UserInputError passes)
        if isinstance(e, UserInputError):
            raise
        raise UserInputError(f"diffusion-pipe config {config} (or its dataset file) has a value that is not what "
                             f"diffusion-pipe takes there ({type(e).__name__}: {e}). Check it against diffusion-pipe's "
                             "examples.") from None


class _Translator:
    def __init__(self, path: Path, cwd: Path):
        self.path, self.cwd = path, cwd
        self.main = _read(path, "diffusion-pipe config")
        self.out = Translation(data={}, source=str(path))
        self.pending = set(self.main) | {
            f"{table}.{k}" for table in ("model", "adapter", "optimizer") if isinstance(self.main.get(table), dict)
            for k in self.main[table]}

    # -- bookkeeping: every field is mapped or ignored exactly once -----------------------------------------

    def take(self, name: str, default: Any = None) -> Any:
        """The value of field `name` ('x' or 'table.x'), marked as handled."""
        self.pending.discard(name)
        if self.has(name):
            self.out.accounted.setdefault(name, "mapped")
        table, _, key = name.rpartition(".")
        source = self.main.get(table, {}) if table else self.main
        value = source.get(key, default) if isinstance(source, dict) else default
        check_kind(f"diffusion-pipe config {self.path}", name, value)
        return value

    def has(self, name: str) -> bool:
        table, _, key = name.rpartition(".")
        source = self.main.get(table, {}) if table else self.main
        return isinstance(source, dict) and key in source

    def set(self, table: str, key: str, value: Any, why: str) -> None:
        self.out.data.setdefault(table, {})[key] = value
        self.out.comments[(table, key)] = why

    def ignore(self, name: str, value: Any, why: str, shown: str | None = None) -> None:
        self.pending.discard(name)
        self.out.accounted[name] = "ignored"
        self.out.ignored.append((f"{shown or name} = {_short(value)}", why))

    def check(self, name: str, text: str) -> None:
        self.out.accounted[name] = "checked"
        self.out.checked.append(text)

    def run(self) -> Translation:
        self.pending -= {"model", "adapter", "optimizer"}  # tables: their fields are handled one by one
        self.model()
        self.adapter_and_optimizer()
        self.training()
        self.dataset()
        for name in sorted(self.pending):
            if name in GENERIC_IGNORED:
                self.ignore(name, self.take(name), GENERIC_IGNORED[name])
        for name in sorted(self.pending):
            self.ignore(name, self.take(name), "not a setting diffusion-pipe reads for Qwen-Image (a typo?)")
        return self.out

    # -- [model] ---------------------------------------------------------------------------------------------

    def model(self) -> None:
        if not isinstance(self.main.get("model"), dict):
            raise UserInputError(f"diffusion-pipe config {self.path} has no [model] table.")
        kind = self.take("model.type")
        if kind != "qwen_image":
            raise UserInputError(f"diffusion-pipe config {self.path}: [model] type = {kind!r}; this trainer trains "
                                 "Qwen-Image (type = 'qwen_image').")
        self.check("model.type", "model.type = 'qwen_image' (Qwen-Image trains here)")
        files = {ours: self.take(f"model.{theirs}") for ours, theirs in
                 (("transformer", "transformer_path"), ("text_encoder", "text_encoder_path"), ("vae", "vae_path"))}
        diffusers = self.take("model.diffusers_path")
        given = [name for name, value in files.items() if value]
        if len(given) == 3:
            self.set("model", "source", "files", "from transformer_path, text_encoder_path, vae_path")
            for name, value in files.items():
                self.set("model", name, str(self.abs(value)), f"model.{name}_path")
            if diffusers and (self.abs(diffusers) / "tokenizer").is_dir():
                self.set("model", "tokenizer", str(self.abs(diffusers) / "tokenizer"), "model.diffusers_path/tokenizer")
            elif diffusers:
                self.ignore("model.diffusers_path", diffusers, "the three model files above are used")
        elif given:
            raise UserInputError(
                f"diffusion-pipe config {self.path}: [model] sets {', '.join(f'{g}_path' for g in given)} but not "
                f"{', '.join(f'{n}_path' for n in files if n not in given)}. Give all three model files, or only "
                "diffusers_path (a diffusers folder's parts cannot be mixed with single files here).")
        elif diffusers:
            self.set("model", "diffusers_folder", str(self.abs(diffusers)), "model.diffusers_path")
        else:
            raise UserInputError(f"diffusion-pipe config {self.path}: [model] names no model (diffusers_path, or "
                                 "transformer_path, text_encoder_path and vae_path).")
        dtype = self.take("model.dtype", "bfloat16")
        compute = {"float32": "float32"}.get(dtype, "auto")
        self.set("model", "compute_dtype", compute, f"model.dtype = {dtype!r}" + (
            "; auto: bfloat16 on a GPU, float32 on a CPU" if compute == "auto" else ""))
        stored = self.take("model.transformer_dtype") or self.take("model.diffusion_model_dtype") or dtype
        storage = {"float8": "float8", "float8_e4m3fn": "float8", "float8_e5m2": "float8", "bfloat16": "bfloat16",
                   "float16": "bfloat16", "float32": "float32"}.get(stored)
        if storage is None:
            raise UserInputError(f"diffusion-pipe config {self.path}: [model] transformer_dtype = {stored!r} is not "
                                 "one of float8, bfloat16, float16, float32.")
        self.set("model", "storage", storage, f"model.transformer_dtype = {stored!r}" + (
            " (float8 here is e4m3fn)" if stored == "float8_e5m2" else ""))
        sampling = self.take("model.timestep_sample_method", "logit_normal")
        self.set("train", "timestep_sampling", sampling, f"model.timestep_sample_method = {sampling!r}")
        if self.has("model.sigmoid_scale"):
            scale = self.take("model.sigmoid_scale")
            self.set("train", "logit_std", float(scale), "model.sigmoid_scale (logit-normal standard deviation)")
        shift, flux_shift = self.take("model.shift"), self.take("model.flux_shift")
        if shift:
            self.set("train", "resolution_shift", True,
                     f"model.shift = {shift}: no constant shift here; Qwen-Image's own size-dependent shift instead "
                     f"({shift_text()})")
        elif flux_shift:
            self.set("train", "resolution_shift", True, "model.flux_shift: with Qwen-Image's own constants")
        else:
            self.set("train", "resolution_shift", False, "diffusion-pipe does not shift Qwen-Image's noise levels "
                                                          "without model.shift or model.flux_shift")

    # -- [adapter], [optimizer] -------------------------------------------------------------------------------

    def adapter_and_optimizer(self) -> None:
        if not isinstance(self.main.get("adapter"), dict):
            raise UserInputError(f"diffusion-pipe config {self.path} has no [adapter] table (a full fine-tune): "
                                 "this trainer trains LoRAs; add [adapter] type = 'lora' and rank = 32.")
        kind = self.take("adapter.type")
        if kind != "lora":
            raise UserInputError(f"diffusion-pipe config {self.path}: [adapter] type = {kind!r}; only 'lora' trains "
                                 "here.")
        self.check("adapter.type", "adapter.type = 'lora' (a LoRA trains here)")
        rank = int(self.take("adapter.rank", 32))
        self.set("lora", "rank", rank, "adapter.rank")
        alpha = self.take("adapter.alpha", rank)
        self.set("lora", "alpha", float(alpha),
                 "adapter.alpha" if self.has("adapter.alpha") else "diffusion-pipe trains with alpha = rank")
        optim = self.main.get("optimizer") if isinstance(self.main.get("optimizer"), dict) else {}
        kind = str(self.take("optimizer.type", "adamw")).lower()
        dtype = self.take("adapter.dtype", self.main["model"].get("dtype", "bfloat16"))
        if dtype in ("bfloat16", "float16") and kind in COMPENSATING:
            self.set("lora", "dtype", "float32", f"adapter.dtype = {dtype!r} with {kind}, which keeps every small "
                                                  "update of bfloat16 weights; float32 weights do that here")
        else:
            ours = "float32" if dtype == "float32" else "bfloat16"
            self.set("lora", "dtype", ours, f"adapter.dtype = {dtype!r}")
        if self.has("adapter.dropout"):
            self.set("lora", "dropout", float(self.take("adapter.dropout")), "adapter.dropout")
        self.set("lora", "targets", "all", "diffusion-pipe adapts every Linear of the blocks, the modulation ones too")
        if self.has("adapter.init_from_existing"):
            path = self.abs(self.take("adapter.init_from_existing"))
            if path.is_dir():
                path = path / "adapter_model.safetensors"
            self.set("lora", "continue_from_lora", str(path), "adapter.init_from_existing")

        if kind == "automagic":
            self.set("optimizer", "optimizer", "automagic", f"optimizer.type = {optim.get('type')!r}: {AUTOMAGIC_WHY}")
            self.set("optimizer", "learning_rate", float(self.take("optimizer.lr", AUTOMAGIC_LR)),
                     "optimizer.lr" if self.has("optimizer.lr") else "automagic's starting rate when lr is not given")
            for name in [n for n in sorted(self.pending) if n.startswith("optimizer.") and n != "optimizer.weight_decay"]:
                self.ignore(name, self.take(name), "an automagic setting kept at its published default here")
        elif kind in ADAMW_FAMILY:
            name, why = ADAMW_FAMILY[kind]
            self.set("optimizer", "optimizer", name, f"optimizer.type = {optim.get('type')!r}" + (f": {why}" if why else ""))
            if self.has("optimizer.lr"):
                self.set("optimizer", "learning_rate", float(self.take("optimizer.lr")), "optimizer.lr")
            elif name == "prodigy":
                self.set("optimizer", "learning_rate", 1.0, "Prodigy's lr when not given (a multiplier)")
            betas = self.take("optimizer.betas")
            if betas:
                self.set("optimizer", "beta1", float(betas[0]), "optimizer.betas[0]")
                self.set("optimizer", "beta2", float(betas[1]), "optimizer.betas[1]")
            if self.has("optimizer.eps"):
                self.set("optimizer", "eps", float(self.take("optimizer.eps")), "optimizer.eps")
            if self.has("optimizer.beta2_half_life"):
                half_life = float(self.take("optimizer.beta2_half_life"))
                batch = global_batch(self.main)
                self.set("optimizer", "beta2", 0.5 ** (batch / half_life),
                         f"optimizer.beta2_half_life = {half_life} at a global batch of {batch} (one process)")
        else:
            lr = field_default(OptimizerConfig, "learning_rate")
            why = f"{optim.get('type')} is not offered: 8-bit AdamW at {lr} (its own settings do not carry over)"
            self.ignore("optimizer.type", optim.get("type"), why)
            self.set("optimizer", "optimizer", "adamw8bit", f"instead of optimizer.type = {optim.get('type')!r}")
            self.set("optimizer", "learning_rate", lr, "8-bit AdamW's learning rate for a LoRA")
            if not self.has("warmup_steps"):
                self.set("optimizer", "warmup_steps", 50, "a short warm-up for AdamW's first steps")
            for name in [n for n in sorted(self.pending) if n.startswith("optimizer.") and n != "optimizer.weight_decay"]:
                self.ignore(name, self.take(name), f"a setting of {optim.get('type')}, which is not used")
        if self.has("optimizer.weight_decay"):
            self.set("optimizer", "weight_decay", float(self.take("optimizer.weight_decay")), "optimizer.weight_decay")

    # -- top-level training settings ----------------------------------------------------------------------------

    def training(self) -> None:
        output = self.take("output_dir")
        if output:
            self.set("output", "folder", str(self.abs(output)), "output_dir")
        self.set("train", "run_name", "qwen_lora", "diffusion-pipe names runs by date; one name resumes here")
        epochs, max_steps = self.take("epochs"), self.take("max_steps")
        self.set("train", "steps", int(max_steps or 0), "max_steps" if max_steps else "no max_steps: epochs decides")
        if epochs:
            self.set("train", "epochs", int(epochs), "epochs")
        micro = self.take("micro_batch_size_per_gpu", 1)
        if isinstance(micro, list):  # [[resolution, batch], ...]: one micro-batch size here
            smallest = min(int(b) for _, b in micro)
            self.set("train", "micro_batch_size", smallest, f"micro_batch_size_per_gpu = {micro}: one size here, "
                                                            "the smallest")
        else:
            self.set("train", "micro_batch_size", int(micro), "micro_batch_size_per_gpu")
        if self.has("image_micro_batch_size_per_gpu"):
            self.set("train", "micro_batch_size", int(self.take("image_micro_batch_size_per_gpu")),
                     "image_micro_batch_size_per_gpu")
        self.set("train", "grad_accum_steps", int(self.take("gradient_accumulation_steps", 1)),
                 "gradient_accumulation_steps (per process)")
        self.set("optimizer", "max_grad_norm", float(self.take("gradient_clipping", 1.0)), "gradient_clipping")
        if self.has("warmup_steps"):
            self.set("optimizer", "warmup_steps", int(self.take("warmup_steps")), "warmup_steps")
        if self.has("force_constant_lr"):
            self.set("optimizer", "learning_rate", float(self.take("force_constant_lr")), "force_constant_lr")
            self.set("optimizer", "schedule", "constant", "force_constant_lr")
        scheduler = self.take("lr_scheduler", "constant")
        if scheduler in ("linear", "cosine") and not self.has("force_constant_lr"):
            if max_steps:
                lr = self.out.data["optimizer"].get("learning_rate", field_default(OptimizerConfig, "learning_rate"))
                floor = 1e-6 / lr if scheduler == "cosine" else 0.0
                self.set("optimizer", "schedule", "cosine", f"lr_scheduler = {scheduler!r}" + (
                    ": linear decay is not offered, cosine to 0 instead" if scheduler == "linear" else ""))
                self.set("optimizer", "schedule_steps", int(max_steps), "max_steps")
                self.set("optimizer", "min_lr_ratio", min(1.0, floor), "diffusion-pipe's cosine floor of 1e-6")
            else:
                self.ignore("lr_scheduler", scheduler, "a decay needs the run's length in steps: set [train] steps and "
                                                       "[optimizer] schedule = 'cosine', schedule_steps")
        if self.has("blocks_to_swap"):
            swap = self.take("blocks_to_swap")
            self.set("train", "blocks_to_swap", "auto",
                     f"blocks_to_swap = {swap}: diffusion-pipe's count fits its own memory use; the memory planner "
                     "picks the fewest that fit this GPU (set a number to force one)")
        checkpointing = self.take("activation_checkpointing", False)
        self.set("train", "gradient_checkpointing", "on" if checkpointing else "off", "activation_checkpointing" + (
            " = 'unsloth': plain checkpointing (its CPU offload of activations is not offered)"
            if checkpointing == "unsloth" else ""))
        if self.has("uncond_fraction"):
            self.set("train", "caption_dropout", float(self.take("uncond_fraction")), "uncond_fraction")
        if self.has("save_dtype"):
            dtype = self.take("save_dtype")
            self.set("output", "dtype", dtype if dtype in ("bfloat16", "float16", "float32") else "bfloat16",
                     f"save_dtype = {dtype!r}")
        for theirs, ours in (("save_every_n_epochs", "snapshot_every_epochs"), ("save_every_n_steps", "snapshot_every")):
            if self.has(theirs):
                self.set("output", ours, int(self.take(theirs)), theirs)
        if self.has("save_every_n_examples"):
            examples = int(self.take("save_every_n_examples"))
            self.set("output", "snapshot_every", max(1, examples // global_batch(self.main)),
                     f"save_every_n_examples = {examples} at a global batch of {global_batch(self.main)} (one process)")
        self.set("output", "filename", "{run_name}_{step}", "diffusion-pipe writes epochN/adapter_model.safetensors")
        self.set("output", "layout", "comfyui", "diffusion-pipe saves Qwen-Image LoRAs in ComfyUI's layout too")
        batch = self.take("caching_batch_size", 1)
        limit = field_meta(CacheConfig, "caching_batch_size")["max"]
        self.set("cache", "caching_batch_size", max(1, min(int(batch), limit)), "caching_batch_size" + (
            f" (at most {limit} here)" if int(batch) > limit else ""))

    # -- the dataset file ----------------------------------------------------------------------------------------

    def dataset(self) -> None:
        name = self.take("dataset")
        if not name:
            raise UserInputError(f"diffusion-pipe config {self.path} names no dataset file (dataset = '...').")
        path = self.abs(name)
        if not path.is_file() and (self.path.parent / name).is_file():
            path = (self.path.parent / name).resolve()  # diffusion-pipe reads it from the working directory
        self.out.dataset_file = str(path)
        self.check("dataset", "dataset (its [[directory]] tables and settings: the [[dataset]] tables)")
        data = _read(path, "diffusion-pipe dataset file")
        directories = data.get("directory")
        if not isinstance(directories, list) or not directories:
            raise UserInputError(f"diffusion-pipe dataset file {path} has no [[directory]] table.")
        top_level = {k: v for k, v in data.items() if k != "directory"}
        for key, value in top_level.items():
            name = f"dataset.{key}"
            if key in DATASET_IGNORED:
                self.ignore(name, value, DATASET_IGNORED[key], shown=f"dataset: {key}")
            elif key in MAPPED_DATASET_KEYS:
                self.out.accounted[name] = "mapped"
            else:
                self.ignore(name, value, "not a dataset setting diffusion-pipe reads (a typo?)", shown=f"dataset: {key}")
        entries = []
        for n, directory in enumerate(directories, 1):
            settings = {**top_level, **directory}
            where = f"dataset: [[directory]] {n}"
            for key, value in directory.items():
                name = f"directory[{n}].{key}"
                if key in DATASET_IGNORED:
                    self.ignore(name, value, DATASET_IGNORED[key], shown=f"{where} {key}")
                elif key in MAPPED_DATASET_KEYS or key == "path":
                    self.out.accounted[name] = "mapped"
                else:
                    self.ignore(name, value, "not a directory setting diffusion-pipe reads (a typo?)",
                                shown=f"{where} {key}")
            if not settings.get("path"):
                raise UserInputError(f"diffusion-pipe dataset file {path}: [[directory]] {n} has no path.")
            for resolution in resolutions(settings.get("resolutions"), path):
                entries.append(self.directory_entry(settings, resolution, len(entries), where))
        self.out.data["dataset"] = entries

    def directory_entry(self, settings: dict, resolution: tuple[int, str], index: int, where: str) -> dict:
        side, resolution_why = resolution
        entry: dict[str, Any] = {}
        notes: dict[str, str] = {}

        def put(key: str, value: Any, why: str) -> None:
            entry[key] = value
            notes[key] = why

        put("folder", str(self.abs(settings["path"])), f"{where} path")
        put("resolution", side, resolution_why)
        buckets = bool(settings.get("enable_ar_bucket", False))
        put("enable_buckets", buckets, "enable_ar_bucket" if "enable_ar_bucket" in settings
            else "diffusion-pipe's default: no aspect buckets (square crops)")
        if buckets:
            low, high, why = aspect_range(settings)
            widest = max(high, 1 / low)
            put("min_bucket_side", max(32, math.floor(side / math.sqrt(widest) / 32) * 32),
                f"the shortest side that {why} gives at {side} px")
            put("max_bucket_side", max(side, math.ceil(side * math.sqrt(widest) / 32) * 32),
                f"the longest side that {why} gives at {side} px")
        check_kind(f"diffusion-pipe dataset file {self.out.dataset_file}, {where}", "num_repeats", settings.get("num_repeats"))
        put("repeats", int(settings.get("num_repeats", 1)), "num_repeats")
        skip = settings.get("skip_empty_caption", True)
        put("missing_caption", "error" if skip else "empty",
            "skip_empty_caption = false" if not skip else
            "diffusion-pipe skips an image without a caption; here it stops and names it (set 'empty' to train "
            "such images with an empty caption)")
        put("upscale_small_images", True, "diffusion-pipe resizes every image to its bucket, smaller ones too")
        self.out.comments.update({("dataset", index, k): v for k, v in notes.items()})
        return entry

    def abs(self, value: str) -> Path:
        path = Path(str(value)).expanduser()
        return path if path.is_absolute() else (self.cwd / path).resolve()


def _read(path: Path, what: str) -> dict:
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserInputError(f"{what} {path} does not exist: check the path (diffusion-pipe takes relative paths "
                             "from the working directory).") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserInputError(f"{what} {path} cannot be read ({getattr(e, 'strerror', None) or e}).") from None
    except tomllib.TOMLDecodeError as e:
        raise UserInputError(f"{what} {path} is not valid TOML: {e}.") from None


def _ordered(table: dict, name: str, order: dict) -> dict:
    return dict(sorted(table.items(), key=lambda item: order.get((name, item[0]), len(order))))


def _short(value: Any) -> str:
    try:
        text = toml_value(value)
    except TypeError:  # a table
        text = "{...}"
    return text if len(text) <= 50 else text[:46] + "...'"
