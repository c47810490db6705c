"""The run file of `python -m trainer_core train --config FILE`: a TOML file of the nodes' settings.

Every key is a field of a config class in config.py, so a run file is checked by the same metadata as the
node widgets (type, range, choices) and then by the classes' own `validate`; `--help-config` prints every
key with that field's help and default. Tables and where their keys come from:

    [model]       the Load node (source, files or diffusers folder, storage, dtypes) and a tokenizer folder
    [[dataset]]   the Dataset node, one table per image folder (each its own resolution, buckets, repeats)
    [cache]       the Cache node's batch size, folder and preservation captions
    [lora]        the LoRA Config node, and continue_from_lora (Init Trainer)
    [optimizer]   the Optimizer node
    [train]       the Init Trainer node, and how long: steps, epochs
    [previews]    the Cache node's prompts, Train Steps' preview_every / size / sampling steps, the Preview
                  node's cfg and seed: images written to disk while training
    [output]      the output folder, the Save node's file name / dtype / layout, LoRA snapshots
    [edit]        Qwen-Image-Edit: the Load Edit node's variant, the Edit Dataset node's control_resolution;
                  with this table the run loads an Edit model (or 2.1) and reads its datasets as edit datasets

Relative paths are relative to the run file's folder (so a run file works from any working directory).
A run file is parsed with the standard library's tomllib; `render` writes one (the diffusion-pipe
translation prints its result with it).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.config import (
    MODEL_SOURCES,
    NO_LORA,
    CacheConfig,
    DatasetConfig,
    EditDataConfig,
    EditLoadConfig,
    HeadlessConfig,
    InitConfig,
    LoadConfig,
    LoraConfig,
    OptimizerConfig,
    PreviewConfig,
    SaveConfig,
    TrainConfig,
    TrainStepsConfig,
    check_value,
    field_default,
    field_meta,
    parse_blocks_to_swap,
    parse_checkpointing,
)
from ..core.errors import MissingPath, UserInputError

_FIELD_DEFAULT = object()  # Key.shown when the template shows the field's own default
# [model] source: the Load node's choices, or a short name for each.
SOURCE_NAMES = dict(zip(("files", "diffusers", "tiny", "shapes"), MODEL_SOURCES))


@dataclass(frozen=True)
class Key:
    """One key of a table: the config field it sets. `help` replaces the field's help where the command line
    means something else (a path relative to the run file instead of a ComfyUI folder); `shown` is the default
    the template shows when the field's own default does not apply here; `path`: resolved against the run
    file's folder."""

    table: str
    name: str
    cls: type
    field: str
    help: str | None = None
    shown: Any = _FIELD_DEFAULT
    path: bool = False

    @property
    def help_text(self) -> str:
        return self.help if self.help is not None else field_meta(self.cls, self.field)["help"]

    @property
    def default(self) -> Any:
        return self.shown if self.shown is not _FIELD_DEFAULT else field_default(self.cls, self.field)


TABLES = {
    "model": "Where Qwen-Image comes from: three model files (transformer, text_encoder, vae: ComfyUI's "
             "files, or those `export-tiny` writes), a diffusers folder, the built-in tiny test model, or the small pretrained shapes model.",
    "dataset": "One [[dataset]] table per image folder (images with same-name .txt captions), each with its own "
               "resolution, buckets and repeats. The same folder twice at two resolutions trains both sizes.",
    "cache": "Latents and prompt embeddings are encoded once into a cache keyed by content.",
    "lora": "The LoRA that trains.",
    "optimizer": "Optimizer and learning-rate schedule.",
    "train": "The run: its name, batches, memory settings, noise levels, checkpoints, and how long it trains.",
    "previews": "Images sampled with the LoRA as it is while training, written to <output>/<run_name>/previews.",
    "output": "Where the run's files go, and the LoRA files it writes.",
    "edit": "Qwen-Image-Edit: with this table the model loads as an Edit model (the Load Edit node: [model]'s "
            "files, diffusers folder or source = \"tiny\" for the tiny Edit test model) and every [[dataset]] is an "
            "edit dataset (the Edit Dataset node's folder convention: name.png + name.txt + name_control.png, ...). "
            "With a Qwen-Image 2.1 model it trains 2.1 reference-image editing: the controls are its reference "
            "images (each 256 px or more), and variant must be auto.",
}

_PATH = "Relative: to the run file's folder."
KEYS = (
    Key("model", "source", LoadConfig, "source", shown="",
        help="'files' (transformer, text_encoder and vae), 'diffusers' (diffusers_folder) 'tiny' (the built-in "
             "tiny test model, random weights) or 'shapes' (the small pretrained model that ships with the pack: it "
             "draws coloured shapes); the Load node's names work too. Empty: from which of those keys "
             "are set."),
    Key("model", "transformer", LoadConfig, "transformer", shown="", path=True,
        help="Qwen-Image transformer file (qwen_image_fp8_e4m3fn or qwen_image_bf16, ComfyUI's; also Qwen-Image-2512's "
             f"qwen_image_2512_fp8_e4m3fn). {_PATH}"),
    Key("model", "text_encoder", LoadConfig, "text_encoder", shown="", path=True,
        help=f"Qwen2.5-VL 7B text encoder file (qwen_2.5_vl_7b_fp8_scaled or qwen_2.5_vl_7b). {_PATH}"),
    Key("model", "vae", LoadConfig, "vae", shown="", path=True,
        help=f"Qwen-Image VAE file (qwen_image_vae; ComfyUI's or diffusers' names). {_PATH}"),
    Key("model", "tokenizer", HeadlessConfig, "tokenizer", path=True),
    Key("model", "diffusers_folder", LoadConfig, "diffusers_folder", path=True,
        help=f"A diffusers Qwen-Image folder (transformer/, vae/, text_encoder/, tokenizer/); with a Qwen-Image 2.1 "
             f"transformer file, the 2.1 folder its text encoder, VAE and processor come from. {_PATH}"),
    Key("model", "storage", LoadConfig, "storage"),
    Key("model", "compute_dtype", LoadConfig, "compute_dtype"),
    Key("model", "text_encoder_fp8", LoadConfig, "text_encoder_fp8"),
    Key("dataset", "folder", DatasetConfig, "folder", path=True,
        help=f"Folder of training images (png/jpg/jpeg/webp), each with a same-name .txt caption. {_PATH}"),
    *(Key("dataset", f.name, DatasetConfig, f.name) for f in dataclasses.fields(DatasetConfig)
      if f.name not in ("folder", "input_folder")),
    Key("cache", "caching_batch_size", CacheConfig, "caching_batch_size"),
    Key("cache", "preservation_trigger", CacheConfig, "preservation_trigger"),
    Key("cache", "preservation_class", CacheConfig, "preservation_class"),
    Key("cache", "cache_folder", CacheConfig, "cache_folder", path=True,
        help=f"Folder of the latent and prompt cache. Empty: <output folder>/cache. Entries are keyed by content, "
             f"so one folder serves many datasets and models. {_PATH}"),
    *(Key("lora", f.name, LoraConfig, f.name) for f in dataclasses.fields(LoraConfig)),
    Key("lora", "continue_from_lora", InitConfig, "continue_from_lora", shown="", path=True,
        help=f"Start from this LoRA file (ComfyUI, diffusers or kohya/musubi layout) instead of from zero: its "
             f"rank, alpha and layers replace the ones above; optimizer and steps start fresh. Empty: from zero. "
             f"{_PATH}"),
    *(Key("optimizer", f.name, OptimizerConfig, f.name) for f in dataclasses.fields(OptimizerConfig)),
    *(Key("train", f.name, TrainConfig, f.name) for f in dataclasses.fields(TrainConfig)),
    Key("train", "steps", HeadlessConfig, "steps"),
    Key("train", "epochs", HeadlessConfig, "epochs"),
    Key("previews", "preview_prompts", CacheConfig, "preview_prompts", shown=[],
        help="Prompts to preview (a list of strings, or one per line): each is sampled every preview_every steps "
             "and at step 0 of a new run. They are encoded while caching, with the captions."),
    Key("previews", "negative_prompt", CacheConfig, "negative_prompt"),
    Key("previews", "preview_every", TrainStepsConfig, "preview_every",
        help="Sample every preview prompt every N steps into <output>/<run_name>/previews/step_N_<prompt "
             "number>.png. 0 = off."),
    Key("previews", "preview_size", TrainStepsConfig, "preview_size"),
    Key("previews", "preview_sampling_steps", TrainStepsConfig, "preview_sampling_steps"),
    Key("previews", "cfg", PreviewConfig, "cfg"),
    Key("previews", "preview_seed", PreviewConfig, "preview_seed"),
    Key("output", "folder", HeadlessConfig, "output_folder", path=True,
        help=f"{field_meta(HeadlessConfig, 'output_folder')['help']} {_PATH}"),
    Key("output", "filename", SaveConfig, "filename",
        help="File name of the LoRA files inside <output>/<run_name>/; {run_name} and {step} are filled in (the only "
             "placeholders; {{ and }} for literal braces)."),
    Key("output", "dtype", SaveConfig, "dtype"),
    Key("output", "layout", SaveConfig, "layout"),
    Key("output", "snapshot_every", TrainStepsConfig, "snapshot_every",
        help="Also save the LoRA every N steps (0 = off), named by filename. The last step's is always saved."),
    Key("output", "snapshot_every_epochs", HeadlessConfig, "snapshot_every_epochs"),
    Key("edit", "variant", EditLoadConfig, "edit_variant",
        help=f"{field_meta(EditLoadConfig, 'edit_variant')['help']} Qwen-Image 2.1 has no variants: auto only."),
    Key("edit", "control_resolution", EditDataConfig, "control_resolution"),
)
_KEYS = {(k.table, k.name): k for k in KEYS}


@dataclass(frozen=True)
class EditRun:
    """The [edit] table: the Load Edit node's variant and the Edit Dataset node's settings."""

    variant: str
    data: EditDataConfig


@dataclass
class RunFile:
    """A run file's settings as the config objects the engine takes; paths are absolute."""

    load: LoadConfig
    datasets: list[DatasetConfig]
    cache: CacheConfig
    lora: LoraConfig
    continue_from_lora: str  # "" = from zero
    optimizer: OptimizerConfig
    train: TrainConfig
    headless: HeadlessConfig
    steps_cfg: TrainStepsConfig  # preview_every / size / sampling steps, snapshot_every
    preview: PreviewConfig  # cfg, preview_seed
    save: SaveConfig
    where: str = "run file"
    edit: EditRun | None = None  # [edit]: a Qwen-Image-Edit run; None: the family the model files say

    @property
    def preview_prompts(self) -> list[str]:
        return [line.strip() for line in self.cache.preview_prompts.splitlines() if line.strip()]

    @property
    def output_folder(self) -> Path:
        return Path(self.headless.output_folder)

    @property
    def run_dir(self) -> Path:
        return self.output_folder / self.train.run_name

    @property
    def cache_folder(self) -> Path:
        return Path(self.cache.cache_folder) if self.cache.cache_folder else self.output_folder / "cache"


def read_run_file(path: str | Path) -> tuple[RunFile, str]:
    """(settings, the file's text) of run file `path`, or a UserInputError naming the file, the table and key."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserInputError(f"run file {path} cannot be read ({getattr(e, 'strerror', None) or e}).") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserInputError(f"run file {path} is not valid TOML: {e}.") from None
    return parse_run_tables(data, path.resolve().parent, str(path)), text


def parse_run_tables(data: dict[str, Any], base: Path, where: str = "run file") -> RunFile:
    """The settings of parsed TOML `data`; relative paths are taken relative to `base`."""
    unknown = [name for name in data if name not in TABLES]
    if unknown:
        raise UserInputError(f"{where}: unknown table{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(f'[{n}]' for n in unknown)}{_did_you_mean(unknown[0], TABLES)}. "
                             f"The tables are {', '.join(f'[{n}]' for n in TABLES)} (see: train --help-config).")
    values: dict[type, dict[str, Any]] = {}
    for table, content in data.items():
        if table == "dataset":
            continue
        if not isinstance(content, dict):
            raise UserInputError(f"{where}: {table} must be a table ([{table}]), not {_kind(content)}.")
        for name, value in content.items():
            key = _key(table, name, where)
            values.setdefault(key.cls, {})[key.field] = _checked(key, value, base, where)
    datasets = _datasets(data.get("dataset"), base, where)
    try:
        run = RunFile(
            load=_model(values.get(LoadConfig, {}), where),
            datasets=datasets,
            cache=CacheConfig(**values.get(CacheConfig, {})),
            lora=LoraConfig(**values.get(LoraConfig, {})),
            continue_from_lora=values.get(InitConfig, {}).get("continue_from_lora", ""),
            optimizer=OptimizerConfig(**values.get(OptimizerConfig, {})),
            train=TrainConfig(**values.get(TrainConfig, {})),
            headless=_headless(values.get(HeadlessConfig, {}), base),
            steps_cfg=TrainStepsConfig(**values.get(TrainStepsConfig, {})),
            preview=PreviewConfig(**values.get(PreviewConfig, {})),
            save=SaveConfig(**values.get(SaveConfig, {})),
            where=where,
            edit=_edit(data, values),
        )
    except UserInputError as e:  # (one that names `where` already, as [model]'s do, is not prefixed twice)
        raise (e if str(e).startswith(f"{where}: ") else UserInputError(f"{where}: {e}")) from None
    if run.steps_cfg.preview_every and not run.preview_prompts:
        raise UserInputError(f"{where}: [previews] preview_every = {run.steps_cfg.preview_every} needs "
                             "preview_prompts: add a prompt, or set preview_every = 0.")
    return run


def _edit(data: dict[str, Any], values: dict[type, dict[str, Any]]) -> EditRun | None:
    if "edit" not in data:
        return None
    variant = values.get(EditLoadConfig, {}).get("edit_variant", field_default(EditLoadConfig, "edit_variant"))
    return EditRun(variant, EditDataConfig(**values.get(EditDataConfig, {})))


def _headless(settings: dict[str, Any], base: Path) -> HeadlessConfig:
    if not settings.get("output_folder"):  # left out or empty: "output" beside the run file
        settings = {**settings, "output_folder": _path(field_default(HeadlessConfig, "output_folder"), base)}
    return HeadlessConfig(**settings)


def _key(table: str, name: str, where: str) -> Key:
    key = _KEYS.get((table, name))
    if key is None:
        names = [k.name for k in KEYS if k.table == table]
        raise UserInputError(f"{where}: [{table}] has no setting {name!r}{_did_you_mean(name, names)}. Its settings: "
                             f"{', '.join(names)} (see: train --help-config).")
    return key


def _did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _kind(value: Any) -> str:
    return {bool: "true/false", int: "a whole number", float: "a number", str: "a text", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)


def _checked(key: Key, value: Any, base: Path, where: str) -> Any:
    """`value` for `key`, converted as the field takes it, or an error naming [table] key and the allowed values."""
    label = f"{where}: [{key.table}] {key.name} = {_shown(value)}"
    default = field_default(key.cls, key.field)
    if key.cls is TrainConfig and key.field == "blocks_to_swap":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise UserInputError(f"{label} must be a whole number or 'auto'.")
        value = parse_blocks_to_swap(value)
    elif key.cls is TrainConfig and key.field == "gradient_checkpointing":
        if not isinstance(value, (bool, str)):
            raise UserInputError(f"{label} must be 'auto', 'on' or 'off' (true/false: on/off).")
        value = parse_checkpointing(value)
    elif key.field == "preview_prompts":
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = "\n".join(value)
        elif not isinstance(value, str):
            raise UserInputError(f"{label} must be a list of prompts (strings).")
    elif isinstance(default, bool):
        if not isinstance(value, bool):
            raise UserInputError(f"{label} must be true or false.")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserInputError(f"{label} must be a whole number, not {_kind(value)}.")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserInputError(f"{label} must be a number, not {_kind(value)}.")
        value = float(value)
    elif not isinstance(value, str):
        raise UserInputError(f"{label} must be a text (in quotes), not {_kind(value)}.")
    if key.path:
        if not value.strip() or (key.cls is InitConfig and value.strip() == NO_LORA):
            return ""
        path = _path(value, base)
        must_be = {"tokenizer": "folder", "continue_from_lora": "file"}.get(key.name)
        if must_be is not None and not (Path(path).is_dir() if must_be == "folder" else Path(path).is_file()):
            raise MissingPath(f"{label} is not a {must_be} (looked for {path}): check the path.")
        return path
    if key.name == "source":
        value = SOURCE_NAMES.get(value.strip().lower(), value) if value.strip() else ""
        if not value:
            return value
    why = check_value(key.cls, key.field, value)
    if why is not None:
        raise UserInputError(f"{label} {why}.")
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, list)) else str(value).lower() if isinstance(value, bool) \
        else repr(value)
    return text if len(text) <= 60 else text[:56] + "..."


def _path(value: str, base: Path) -> str:
    path = Path(value.strip()).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def _model(settings: dict[str, Any], where: str) -> LoadConfig:
    """LoadConfig with its source decided and the paths the source needs present; the node's file names (which
    ComfyUI resolves in its model folders) do not apply here, so unset files stay empty."""
    files = ("transformer", "text_encoder", "vae")
    settings = {"transformer": "", "text_encoder": "", "vae": "", **settings}
    source = settings.get("source", "")
    if not source:
        if settings.get("diffusers_folder"):
            source = SOURCE_NAMES["diffusers"]
        elif any(settings[name] for name in files):
            source = SOURCE_NAMES["files"]
        else:
            raise UserInputError(
                f"{where}: [model] says no model: set source = \"tiny\" (the built-in test model), diffusers_folder, "
                "or transformer, text_encoder and vae (model files).")
    settings["source"] = source
    if source == SOURCE_NAMES["files"] and settings.get("diffusers_folder"):
        # A family whose files name a folder for their other parts (2.1: its processor, and the text encoder and
        # VAE when their files are left out) reads the folder; the family's loader says what it still needs.
        files = ("transformer",) + tuple(name for name in ("text_encoder", "vae") if settings[name])
    if source == SOURCE_NAMES["files"]:
        missing = [name for name in files if not settings[name]]
        if missing and settings["transformer"] and Path(settings["transformer"]).is_file():
            from ..families.loading import missing_with_file

            advice = missing_with_file(Path(settings["transformer"]))  # (2.1: the folder, which alone trains)
            if advice:
                raise UserInputError(f"{where}: [model] {advice}")
        if missing:
            raise UserInputError(f"{where}: [model] reads model files but {', '.join(missing)} "
                                 f"{'is' if len(missing) == 1 else 'are'} not set: give the path of each file.")
        for name in files:
            if not Path(settings[name]).is_file():
                raise MissingPath(f"{where}: [model] {name} = {settings[name]!r} is not a file: check the path.")
    if (source == SOURCE_NAMES["diffusers"] or settings.get("diffusers_folder")) and \
            not Path(settings.get("diffusers_folder") or ".").is_dir():
        raise MissingPath(f"{where}: [model] diffusers_folder = {settings.get('diffusers_folder', '')!r} is not a "
                             "folder: check the path, or set it.")
    return LoadConfig(**settings)


def _datasets(entries: Any, base: Path, where: str) -> list[DatasetConfig]:
    if entries is None:
        raise UserInputError(f"{where}: no [[dataset]] table: add one with folder = \"<your images>\".")
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UserInputError(f"{where}: dataset must be tables ([[dataset]]), not {_kind(entries)}.")
    datasets = []
    for n, entry in enumerate(entries, 1):
        label = f"{where} (dataset {n} of {len(entries)})" if len(entries) > 1 else where
        settings = {name: _checked(_key("dataset", name, label), value, base, label) for name, value in entry.items()}
        if not settings.get("folder"):
            raise UserInputError(f"{label}: [[dataset]] needs folder = \"<folder of images with .txt captions>\".")
        try:
            datasets.append(DatasetConfig(**settings))  # checked as it is made
        except UserInputError as e:
            raise UserInputError(f"{label}: {e}") from None
    return datasets
