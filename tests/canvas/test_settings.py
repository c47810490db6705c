"""One source for every setting: each widget of each node is its config field (trainer_core/core/config.py).

The tooltip is the field's help, and default, min/max/step, choices and multiline are the field's. A
tooltip, range or choice list written inline in nodes/ fails here. Sockets (linked inputs of our custom
types or ComfyUI's) are exempt: they are not settings.
"""

from __future__ import annotations

import dataclasses

import pytest

from conftest import pack_module

# The config dataclasses each node's widgets come from. A new node must be added here, and each of its
# widgets must be a field of one of these (a widget with no config field fails).
NODE_SETTINGS = {
    "QwenLoRALoadModels": ("LoadConfig",),
    "QwenLoRADataset": ("DatasetConfig",),
    "QwenLoRACache": ("CacheConfig",),
    "QwenLoRAConfig": ("LoraConfig",),
    "QwenLoRAOptimizer": ("OptimizerConfig",),
    "QwenLoRAInitTrainer": ("TrainConfig", "InitConfig"),
    "QwenLoRATrain": ("TrainStepsConfig",),
    "QwenLoRAPreview": ("PreviewConfig",),
    "QwenLoRALossPlot": ("LossPlotConfig",),
    "QwenLoRACompareSteps": ("CompareStepsConfig",),
    "QwenLoRASave": ("SaveConfig",),
    "QwenLoRARelease": (),  # a trainer socket only
    "QwenLoRADatasetMix": (),  # dataset sockets only
    "QwenLoRALoadEditModels": ("EditLoadConfig",),
    "QwenLoRAEditDataset": ("DatasetConfig", "EditDataConfig"),
    "QwenLoRAEditPreview": ("PreviewConfig",),
    "QwenLoRALayeredDataset": ("DatasetConfig",),
    "QwenLoRACaptionDataset": ("CaptionConfig",),
    "QwenLoRAImagesToDataset": ("DatasetConfig", "data.graph_images.GraphImagesConfig"),
}
# Settings a node leaves out on purpose: a Layered sample keeps its alpha always (no transparency choice).
# Images to Dataset has pictures, not files: no folder, caption files or file decoding limits.
LEFT_OUT = {"QwenLoRALayeredDataset": {"DatasetConfig.transparency"},
            "QwenLoRAImagesToDataset": {f"DatasetConfig.{name}" for name in (
                "folder", "input_folder", "caption_extension", "missing_caption", "allow_large_images")}}
WIDGET_TYPES = {"INT": int, "FLOAT": float, "BOOLEAN": bool, "STRING": str}
OPTION_KEYS = {"default", "tooltip", "min", "max", "step", "round", "multiline"}

# Files in the model folders the node lists: the transformer's default is present, the VAE's is not.
MODEL_FILES = {"diffusion_models": ["other.safetensors", "qwen_image_fp8_e4m3fn.safetensors"],
               "text_encoders": [], "vae": ["a_vae.safetensors", "b_vae.safetensors"],
               "loras": ["mine.safetensors"]}


@pytest.fixture(autouse=True)
def model_folders(tmp_path, monkeypatch):
    for kind, names in MODEL_FILES.items():
        (tmp_path / kind).mkdir()
        for name in names:
            (tmp_path / kind / name).write_bytes(b"")
    monkeypatch.setenv("QWEN_LORA_MODELS", str(tmp_path))


def is_socket(spec) -> bool:
    return not isinstance(spec[0], list) and (spec[0] not in WIDGET_TYPES or spec[1].get("forceInput", False))


def config_class(pack, name: str) -> type:
    """A config class by name: in trainer_core.core.config, or 'package.module.X' in that module of trainer_core."""
    module, _, cls = name.rpartition(".")
    return getattr(pack_module(pack, f"trainer_core.{module or 'core.config'}"), cls)


def widget_fields(pack):
    """(node, input name, spec, config class, field) for every widget input of every node."""
    config = pack_module(pack, "trainer_core.core.config")
    renamed = {widget: name for name, widget in pack_module(pack, "nodes.train_nodes").WIDGET_NAMES.items()}
    assert set(NODE_SETTINGS) == set(pack.NODE_CLASS_MAPPINGS), "a node without its config classes listed here"
    for node, cls in pack.NODE_CLASS_MAPPINGS.items():
        sources = [config_class(pack, name) for name in NODE_SETTINGS[node]]
        for group in cls.INPUT_TYPES().values():
            for input_name, spec in group.items():
                if is_socket(spec):
                    continue
                name = renamed.get(input_name, input_name) if node == "QwenLoRAInitTrainer" else input_name
                found = [(c, f) for c in sources for f in dataclasses.fields(c) if f.name == name]
                assert len(found) == 1, f"{node}.{input_name} is not a field of {NODE_SETTINGS[node]}"
                yield node, input_name, spec, *found[0]


def test_every_widget_of_every_node_is_its_config_field(pack):
    host = pack_module(pack, "nodes.host")
    checked = 0
    for node, input_name, spec, cls, f in widget_fields(pack):
        where = f"{node}.{input_name} ({cls.__name__}.{f.name})"
        kind, options = spec
        meta = f.metadata
        assert set(options) <= OPTION_KEYS, f"{where}: unexpected options {set(options) - OPTION_KEYS}"
        assert options["tooltip"] == meta["help"], f"{where}: tooltip is not the config help"
        if "file_list" in meta:  # the host's file list, with the config default preselected when present
            extras, listed = list(meta.get("extra_choices", ())), host.model_file_list(meta["file_list"])
            assert kind == [*extras, *listed], where
            assert options["default"] == (f.default if f.default in kind else ([*listed, *extras] or [""])[0]), where
        elif "folder_list" in meta:  # the input folder's subfolders after the extra choices
            folders = [*meta.get("extra_choices", ()), *host.input_subfolders()]
            assert kind == folders and options["default"] == f.default, where
        elif "choices" in meta:
            assert kind == list(meta["choices"]) and options["default"] == f.default, where
        else:
            assert kind in WIDGET_TYPES and type(f.default) is WIDGET_TYPES[kind], f"{where}: widget type {kind}"
            assert options["default"] == f.default, f"{where}: default"
            for key in ("min", "max", "step"):
                assert options.get(key) == meta.get(key), f"{where}: {key} {options.get(key)} != {meta.get(key)}"
            assert options.get("multiline", False) == meta.get("multiline", False), f"{where}: multiline"
        checked += 1
    assert checked >= 60  # every widget of the ten nodes


def test_every_setting_of_a_node_has_its_widget(pack):
    """The other way round: each field of a node's config classes is one of its widgets (no setting that
    the canvas cannot reach)."""
    used: dict[str, set[str]] = {}
    for node, _, _, cls, f in widget_fields(pack):
        used.setdefault(node, set()).add(f"{cls.__name__}.{f.name}")
    for node, names in NODE_SETTINGS.items():
        fields = {f"{config_class(pack, name).__name__}.{f.name}" for name in names
                  for f in dataclasses.fields(config_class(pack, name))} - LEFT_OUT.get(node, set())
        assert used.get(node, set()) == fields, f"{node}: settings without a widget: {fields - used.get(node, set())}"


def test_file_choices_list_the_model_folder_and_preselect_the_usual_file(pack):
    required = pack.NODE_CLASS_MAPPINGS["QwenLoRALoadModels"].INPUT_TYPES()["required"]
    assert required["transformer"] == (["(not used)", *MODEL_FILES["diffusion_models"]], {
        "default": "qwen_image_fp8_e4m3fn.safetensors", "tooltip": required["transformer"][1]["tooltip"]})
    assert required["vae"][1]["default"] == "a_vae.safetensors"  # the usual file is absent: the first one
    # none there: only the choice for workflows that load no files (the tiny model, a diffusers folder)
    assert required["text_encoder"][0] == ["(not used)"] and required["text_encoder"][1]["default"] == "(not used)"
    init = pack.NODE_CLASS_MAPPINGS["QwenLoRAInitTrainer"].INPUT_TYPES()["required"]
    assert init["continue_from_lora"][0] == ["(none: start from zero)", "mine.safetensors"]
    assert init["continue_from_lora"][1]["default"] == "(none: start from zero)"


def test_an_inline_tooltip_is_caught(pack, monkeypatch):
    """The check above fails for a widget written in a node instead of taken from the config."""
    cls = pack.NODE_CLASS_MAPPINGS["QwenLoRASave"]
    original = cls.INPUT_TYPES.__func__

    def inline(klass):
        spec = original(klass)
        spec["required"]["dtype"] = (["bfloat16", "float16", "float32"],
                                     {"default": "bfloat16", "tooltip": "Precision (written in the node)."})
        return spec

    monkeypatch.setattr(cls, "INPUT_TYPES", classmethod(inline))
    with pytest.raises(AssertionError, match="tooltip is not the config help"):
        test_every_widget_of_every_node_is_its_config_field(pack)

    def extra_widget(klass):
        spec = original(klass)
        spec["required"]["strength"] = ("FLOAT", {"default": 1.0, "tooltip": "Not in any config."})
        return spec

    monkeypatch.setattr(cls, "INPUT_TYPES", classmethod(extra_widget))
    with pytest.raises(AssertionError, match="is not a field of"):
        test_every_widget_of_every_node_is_its_config_field(pack)


def config_classes():
    """Every settings class: the run's (config.py) and the other nodes' and commands' (command_config.py)."""
    from trainer_core.core import command_config, config

    own = (config.__name__, command_config.__name__)
    return [c for c in vars(config).values() if dataclasses.is_dataclass(c) and c.__module__ in own]


@pytest.mark.parametrize("cls", config_classes(), ids=lambda c: c.__name__)
def test_every_config_field_has_help_and_a_default_it_allows(cls):
    from trainer_core.core.config import check_value

    for f in dataclasses.fields(cls):
        assert len(f.metadata.get("help", "")) > 10, f"{cls.__name__}.{f.name} has no help"
        if "file_list" not in f.metadata:
            assert check_value(cls, f.name, f.default) is None, f"{cls.__name__}.{f.name} default not allowed"


def test_engine_constants_are_the_config_choices():
    """One list per set of allowed values: the engine modules use the config's."""
    from trainer_core import models
    from trainer_core.core import config
    from trainer_core.adapters import lora_files

    assert models.STORAGE_MODES is config.STORAGE_MODES is config.LoadConfig.__dataclass_fields__[
        "storage"].metadata["choices"]
    assert models.TEXT_ENCODER_FP8_MODES is config.TEXT_ENCODER_FP8_MODES
    assert lora_files.LORA_LAYOUTS is config.LORA_LAYOUTS is config.choices(config.SaveConfig, "layout")


def test_a_workflow_saved_with_the_old_checkpointing_switch_still_validates(pack):
    """gradient_checkpointing was a true/false widget before 'auto': the Init node's VALIDATE_INPUTS (which takes
    ComfyUI's list check over for that input) accepts those values as on/off and names the choices otherwise."""
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRAInitTrainer"]
    widget = node.INPUT_TYPES()["required"]["gradient_checkpointing"]
    assert widget[0] == ["auto", "on", "off"] and widget[1]["default"] == "auto"
    assert all(node.VALIDATE_INPUTS(gradient_checkpointing=v) is True for v in (True, False, "auto", "on", "off"))
    why = node.VALIDATE_INPUTS(gradient_checkpointing="sometimes")
    assert isinstance(why, str) and "'auto'" in why and "'off'" in why
