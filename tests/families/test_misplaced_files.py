"""A model file in the wrong place never trains as something else: a member's file loaded by a node that would train
it as another member is refused, naming the member and the node or setting that trains it; a file cut short is named
as such before any family guesses from its keys; a run file naming only a 2.1 transformer is asked for the one setting
that lets it train (the folder). Real tiny files as the exporters write them (int8 ones by comfy-kitchen)."""

from __future__ import annotations

import pytest

from trainer_core.core.config import MODEL_SOURCES
from trainer_core.core.errors import UserInputError
from trainer_core.families import get_family
from trainer_core.families.loading import LoadRequest, load_model_set

FILES, DIFFUSERS = MODEL_SOURCES[0], MODEL_SOURCES[1]


@pytest.fixture(scope="module")
def edit_2511(tmp_path_factory):
    return get_family("edit-2511").export_tiny(tmp_path_factory.mktemp("edit_2511"))


@pytest.fixture(scope="module")
def qwen21(tmp_path_factory):
    return get_family("qwen-image-2.1").export_tiny(tmp_path_factory.mktemp("qwen21"))


def copied(path, target):
    """A copy of a tiny model file under another name, with the config JSON beside it (a tiny model's RoPE axes)."""
    import shutil

    shutil.copy(path, target)
    if path.with_suffix(".json").is_file():
        shutil.copy(path.with_suffix(".json"), target.with_suffix(".json"))
    return target


def request(transformer, text_encoder=None, vae=None, edit=False, **more):
    return LoadRequest(FILES, "cpu", storage="float32", compute_dtype="float32", transformer=transformer,
                       text_encoder=text_encoder, vae=vae, edit=edit, **more)


@pytest.mark.parametrize("file", ["transformer_bf16", "transformer_fp8_e4m3fn_scaled"])
def test_an_edit_2511_transformer_in_the_text_to_image_load_is_refused_naming_load_edit(edit_2511, tmp_path, file):
    """Its marker key tells it, whatever the file is called (here renamed, so no name helps)."""
    renamed = copied(edit_2511[file], tmp_path / "my_favourite_model.safetensors")
    for path in (edit_2511[file], renamed):
        with pytest.raises(UserInputError, match=rf"transformer file {path} is Qwen-Image-Edit-2511, an edit model, but "
                                                 r"it was loaded by the text-to-image Load node .* Load it with the Load "
                                                 r"Qwen-Image-Edit node and an Edit Dataset \(in a run file, add an "
                                                 r"\[edit\] table\)"):
            load_model_set(request(path, edit_2511["text_encoder_bf16"], edit_2511["vae"]))
    loaded = load_model_set(request(renamed, edit_2511["text_encoder_bf16"], edit_2511["vae"], edit=True))
    assert loaded.family.name == "edit-2511"  # where it belongs, it loads


def test_edit_files_by_their_comfyui_names_and_edit_folders_are_refused_by_the_text_to_image_load(tmp_path):
    """Edit and Edit-2509 files have Qwen-Image's tensors: their ComfyUI names tell them (and a folder its pipeline)."""
    files = get_family("edit-2509").export_tiny(tmp_path / "e2509")
    named = copied(files["transformer_bf16"], tmp_path / "qwen_image_edit_2509_fp8_e4m3fn.safetensors")
    with pytest.raises(UserInputError, match=r"is Qwen-Image-Edit-2509, an edit model"):
        load_model_set(request(named, files["text_encoder_bf16"], files["vae"]))
    folder = get_family("edit-2511").export_tiny(tmp_path / "dir", layout="diffusers")["diffusers_folder"]
    with pytest.raises(UserInputError, match=rf"diffusers folder {folder} is Qwen-Image-Edit-2511, an edit model"):
        load_model_set(LoadRequest(DIFFUSERS, "cpu", storage="float32", compute_dtype="float32",
                                   diffusers_folder=str(folder)))


def test_a_text_to_image_qwen_image_file_in_load_edit_is_refused_naming_the_load_node(tiny_files, tmp_path):
    named = copied(tiny_files["transformer_bf16"], tmp_path / "qwen_image_bf16.safetensors")
    with pytest.raises(UserInputError, match=rf"transformer file {named} is Qwen-Image, a text-to-image model, but it "
                                             r"was loaded by the Load Qwen-Image-Edit node .* load this one with the "
                                             r"Load Qwen-Image node \(in a run file, remove the \[edit\] table\)"):
        load_model_set(request(named, tiny_files["text_encoder_bf16"], tiny_files["vae"], edit=True))


def test_a_layered_transformer_in_load_edit_is_refused_naming_the_load_node(tmp_path):
    files = get_family("qwen-image-layered").export_tiny(tmp_path / "layered")
    transformer = next(v for k, v in files.items() if k.startswith("transformer"))
    text_encoder = next(v for k, v in files.items() if k.startswith("text_encoder"))
    with pytest.raises(UserInputError, match=rf"transformer file {transformer} is Qwen-Image-Layered .* loaded by the "
                                             r"Load Qwen-Image-Edit node .* Load it with the Load Qwen-Image node and a "
                                             r"Layered dataset"):
        load_model_set(request(transformer, text_encoder, files["vae"], edit=True))


def cut(path, keep: float, target):
    data = path.read_bytes()
    target.write_bytes(data[: int(len(data) * keep)])
    return target


@pytest.mark.parametrize("keep", [0.6, 0.0005])  # the data cut short; the header itself cut
def test_a_cut_qwen_image21_int8_file_is_named_cut_short_not_taken_for_another_model(qwen21, tmp_path, keep):
    """Before: a cut 2.1 file was "not 2.1" (its header unreadable), so Qwen-Image's loader took it and asked for a
    1.x text encoder, never naming the file."""
    from int8_files import int8_copy

    int8 = int8_copy(qwen21["transformer_bf16"], tmp_path / "qwen_image_2.1_int8_convrot.safetensors",
                     lambda key: key.startswith("transformer_blocks."))
    broken = cut(int8, keep, tmp_path / "cut_int8_convrot.safetensors")
    for req in (request(broken), request(broken, diffusers_folder=str(qwen21["diffusers_folder"])),
                request(broken, edit=True)):
        with pytest.raises(UserInputError, match=rf"^transformer file {broken} is not a readable .safetensors file .*: "
                                                 r"it is cut short \(an interrupted download or copy\), damaged"):
            load_model_set(req)


def test_a_cut_text_encoder_or_vae_file_is_named_before_the_transformer_is_read(qwen21, tmp_path):
    text_encoder = cut(qwen21["text_encoder"], 0.5, tmp_path / "qwen3vl_cut.safetensors")
    with pytest.raises(UserInputError, match=rf"^text encoder file {text_encoder} is not a readable .*cut short"):
        load_model_set(request(qwen21["transformer_bf16"], text_encoder, qwen21["vae"],
                               diffusers_folder=str(qwen21["diffusers_folder"])))
    vae = cut(qwen21["vae"], 0.5, tmp_path / "vae_cut.safetensors")
    with pytest.raises(UserInputError, match=rf"^vae file {vae} is not a readable .*cut short"):
        load_model_set(request(qwen21["transformer_bf16"], None, vae, diffusers_folder=str(qwen21["diffusers_folder"])))


def run_file_tables(transformer, folder, **model):
    return {"model": {"transformer": str(transformer), **model},
            "dataset": [{"folder": str(folder), "resolution": 64}], "train": {"steps": 1}}


def test_a_run_file_with_only_a_21_transformer_is_asked_for_the_folder_which_alone_trains(qwen21, demo_folder, tiny_files,
                                                                                          tmp_path):
    from trainer_core.runs.run_file import parse_run_tables

    with pytest.raises(UserInputError) as refused:
        parse_run_tables(run_file_tables(qwen21["transformer_bf16"], demo_folder), tmp_path)
    message = str(refused.value)
    assert "is Qwen-Image 2.1" in message and "set diffusers_folder to that folder" in message, message
    assert "the transformer file alone trains" in message and "are not set" not in message, message
    run = parse_run_tables(run_file_tables(qwen21["transformer_bf16"], demo_folder,
                                           diffusers_folder=str(qwen21["diffusers_folder"])), tmp_path)
    load = run.load
    loaded = load_model_set(request(load.transformer, diffusers_folder=load.diffusers_folder))
    assert loaded.family.name == "qwen-image-2.1"  # the folder was all it needed
    # A 1.x transformer alone is still told to set its text encoder and VAE files (what it does need).
    with pytest.raises(UserInputError, match="reads model files but text_encoder, vae are not set"):
        parse_run_tables(run_file_tables(tiny_files["transformer_bf16"],
                                         demo_folder), tmp_path)


def test_a_text_to_image_diffusers_folder_in_load_edit_is_refused(tmp_path):
    folder = get_family("qwen-image").export_tiny(tmp_path / "t2i", layout="diffusers")["diffusers_folder"]
    with pytest.raises(UserInputError, match=rf"diffusers folder {folder} is text-to-image Qwen-Image .* load this one "
                                             r"with the Load Qwen-Image node"):
        load_model_set(LoadRequest(DIFFUSERS, "cpu", storage="float32", compute_dtype="float32",
                                   diffusers_folder=str(folder), edit=True))
