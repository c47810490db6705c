"""The lazy, phase-separated model set read from single files (models/components.py, single_file.py).

What is counted here is exact: bytes of tensor data read per file (`TENSOR_BYTES_READ`), and tensor bytes
alive while the transformer streams in (`devtools.memprobe.LiveBytes`).
"""

import shutil

import pytest
import torch

from tests.conftest import cached_demo
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.families.qwen_image import load_single_files
from trainer_core.models.safetensors_file import TENSOR_BYTES_READ, SafetensorsFile
from trainer_core.models.streaming import empty_transformer


def bytes_read(path) -> int:
    return TENSOR_BYTES_READ[str(path.resolve())]


def scale_bytes(path) -> int:
    """Bytes of the per-Linear fp32 scales a scaled-fp8 file holds (read when the file is chosen), those of
    the text encoder's vision tower (never loaded for Qwen-Image) left out."""
    file = SafetensorsFile(path, "any")
    keys = [k for k in file.keys if k.endswith("scale_weight") and not k.startswith("visual.")]
    return sum(end - start for start, end in map(file.byte_range, keys))


def load(files, text_encoder="text_encoder_bf16", transformer="transformer_fp8_e4m3fn", **kwargs):
    return load_single_files(files[transformer], files[text_encoder], files["vae"],
                             storage="float8", compute_dtype=torch.float32, **kwargs)


def copy_set(tiny_files, tmp_path, names):
    """The chosen files (and their config JSONs) copied under new names into a new folder, with the tokenizer."""
    out = {}
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name in names:
        source = tiny_files[name]
        out[name] = tmp_path / f"renamed_{source.name}"
        shutil.copy(source, out[name])
        shutil.copy(source.with_suffix(".json"), out[name].with_suffix(".json"))
    shutil.copytree(tiny_files["vae"].parent.parent / "tokenizer", tmp_path / "tokenizer")
    return out


def test_loading_reads_headers_only(tiny_files):
    before = TENSOR_BYTES_READ.copy()
    components = load(tiny_files, text_encoder="text_encoder_fp8_scaled", transformer="transformer_fp8_e4m3fn_scaled")
    read = {p: n - before[p] for p, n in TENSOR_BYTES_READ.items() if n != before[p]}
    # Only the scaled files' per-Linear scales (checked for NaN when the file is chosen) are read.
    assert read == {str(tiny_files[k].resolve()): scale_bytes(tiny_files[k])
                    for k in ("text_encoder_fp8_scaled", "transformer_fp8_e4m3fn_scaled")}
    assert components.loaded_parts() == []
    assert components.num_blocks == 2 and len(components.skeleton().transformer_blocks) == 2


def test_a_warm_rerun_reads_no_text_encoder_or_vae_weights(tiny_files, demo_folder, tmp_path):
    cache = tmp_path / "cache"
    first = load(tiny_files)
    cold = cached_demo(first, demo_folder, cache)
    assert cold.report.prompts_encoded > 0 and bytes_read(tiny_files["text_encoder_bf16"]) > 0
    assert first.loaded_parts() == []  # text encoder and VAE dropped when caching ended

    before = TENSOR_BYTES_READ.copy()
    again = load(tiny_files)
    warm = cached_demo(again, demo_folder, cache)
    assert (warm.report.prompts_encoded, warm.report.latents_encoded) == (0, 0)
    for part in ("text_encoder_bf16", "vae", "transformer_fp8_e4m3fn"):
        assert bytes_read(tiny_files[part]) == before[str(tiny_files[part].resolve())], part
    assert again.loaded_parts() == []


def test_a_moved_and_renamed_model_file_keeps_its_cache(tiny_files, demo_folder, tmp_path):
    cache = tmp_path / "cache"
    original = load(tiny_files)
    cached_demo(original, demo_folder, cache)
    moved = copy_set(tiny_files, tmp_path / "elsewhere", ("transformer_fp8_e4m3fn", "text_encoder_bf16", "vae"))
    components = load(moved)
    assert {p: components.fingerprint(p) for p in ("transformer", "vae", "text_encoder")} == \
        {p: original.fingerprint(p) for p in ("transformer", "vae", "text_encoder")}
    report = cached_demo(components, demo_folder, cache).report
    assert (report.prompts_encoded, report.latents_encoded) == (0, 0)


def test_another_file_of_the_same_shapes_has_another_identity(tiny_files, tmp_path):
    """Same header, other values (a different training of one architecture): a different identity."""
    from safetensors.torch import load_file, save_file

    copy = copy_set(tiny_files, tmp_path, ("text_encoder_bf16",))["text_encoder_bf16"]
    tensors = load_file(str(copy))
    tensors = {k: (v * 1.5 if v.is_floating_point() else v) for k, v in tensors.items()}
    save_file(tensors, str(copy))
    assert load(tiny_files).fingerprint("text_encoder") != load({**tiny_files, "text_encoder_bf16": copy}).fingerprint("text_encoder")


def test_the_transformer_streams_in_without_a_second_copy(tiny_files):
    """Peak tensor bytes while streaming the transformer = the model's final bytes + what one tensor in flight
    needs; a whole-model host copy (the old way: read everything, then convert) would add the model again."""
    from trainer_core.devtools.memprobe import LiveBytes

    components = load(tiny_files, transformer="transformer_bf16")  # bf16 file -> float8 storage: converted per tensor
    file = components.transformer_source.file
    largest = max(end - start for start, end in (file.byte_range(k) for k in file.keys))
    source = components.transformer_source
    model = empty_transformer(source.config)  # (its RoPE tables are made here, before any weight is read)
    with LiveBytes() as live:
        source.fill(model)
    held = live.current  # the weights read
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    # In flight: the tensor as read, its fp32 dequantised values and its stored (float8) form.
    assert live.peak <= held + 4 * largest
    assert held == weights
    assert weights > 4 * largest  # so the bound above really excludes a second copy of the weights


def test_training_from_a_lazy_set_equals_training_from_a_loaded_one(tiny_files, demo_folder, tmp_path):
    """Streaming the transformer into its placement at Init (swapped block's weights to host memory) trains
    bit for bit like the transformer loaded whole beforehand."""
    from trainer_core.models.transformer_file import load_transformer_file
    from trainer_core.training import Trainer

    losses = []
    for lazy in (True, False):
        components = load(tiny_files)
        if not lazy:
            components.transformer = load_transformer_file(tiny_files["transformer_fp8_e4m3fn"], "float8", torch.float32)
        dataset = cached_demo(components, demo_folder, tmp_path / "cache")
        trainer = Trainer(components, dataset, LoraConfig(rank=4), OptimizerConfig(learning_rate=1e-3),
                          TrainConfig(run_name="lazy", blocks_to_swap=1))
        losses.append(trainer.train(3).losses)
        trainer.close()
    assert losses[0] == losses[1]


def test_releasing_a_run_drops_the_transformer_and_the_next_init_streams_it_again(tiny_files, demo_folder, tmp_path):
    from trainer_core.runs import registry as runs

    components = load(tiny_files)
    dataset = cached_demo(components, demo_folder, tmp_path / "cache")
    settings = (LoraConfig(rank=4), OptimizerConfig(learning_rate=1e-3), TrainConfig(run_name="lazy-release"))
    first = runs.open_run(components, dataset, *settings, run_dir=tmp_path / "run").trainer
    first.train(2)
    message = runs.release("lazy-release")
    assert "transformer dropped from memory" in message
    assert components.transformer is None and components.loaded_parts() == []
    before = bytes_read(tiny_files["transformer_fp8_e4m3fn"])
    opened = runs.open_run(components, dataset, *settings, run_dir=tmp_path / "run")
    assert opened.trainer.step == 2 and bytes_read(tiny_files["transformer_fp8_e4m3fn"]) > before
    runs.release("lazy-release")


@pytest.mark.parametrize("fp8", ["dequantize", "keep"])
def test_the_text_encoder_identity_names_how_it_computes(tiny_files, fp8):
    """Embeddings from a dequantised and a kept-float8 encoder differ in the last bits: separate cache entries."""
    components = load(tiny_files, text_encoder="text_encoder_fp8_scaled", text_encoder_fp8=fp8)
    other = load(tiny_files, text_encoder="text_encoder_fp8_scaled",
                 text_encoder_fp8="keep" if fp8 == "dequantize" else "dequantize")
    assert components.fingerprint("text_encoder") != other.fingerprint("text_encoder")
    assert components.fingerprint("transformer") == other.fingerprint("transformer")


def test_a_checkpoint_named_by_the_weights_fingerprint_still_resumes(tiny_files, demo_folder, tmp_path):
    """Checkpoints written before file identities name the base model by its weights' fingerprint: continued."""
    import json

    from trainer_core.training.checkpoint import LATEST, STATE_JSON, checkpoints_dir
    from trainer_core.models.components import module_fingerprint
    from trainer_core.models.transformer_file import load_transformer_file
    from trainer_core.training import Trainer

    components = load(tiny_files)
    dataset = cached_demo(components, demo_folder, tmp_path / "cache")
    settings = (LoraConfig(rank=4), OptimizerConfig(learning_rate=1e-3), TrainConfig(run_name="old"))
    trainer = Trainer(components, dataset, *settings, run_dir=tmp_path / "run")
    trainer.train(2)
    trainer.save_checkpoint()
    trainer.close()
    state = checkpoints_dir(tmp_path / "run") / json.loads((checkpoints_dir(tmp_path / "run") / LATEST).read_text())["dir"] / STATE_JSON
    meta = json.loads(state.read_text())
    weights = module_fingerprint(load_transformer_file(tiny_files["transformer_fp8_e4m3fn"], "float8", torch.float32))
    assert meta["base_fingerprint"] == components.fingerprint("transformer") != weights
    state.write_text(json.dumps({**meta, "base_fingerprint": weights}))  # as the previous version wrote it

    again = Trainer(load(tiny_files), dataset, *settings, run_dir=tmp_path / "run")
    assert again.resume() and again.step == 2
    again.close()


def test_a_run_that_does_not_fit_the_ram_is_refused_before_the_transformer_is_read(tiny_files, demo_folder, tmp_path,
                                                                                   monkeypatch):
    """Init Trainer plans every phase against the machine's RAM first: too little, and nothing of the
    transformer's weights has been read when it says so (and names what to change)."""
    from trainer_core.core.errors import UserInputError
    from trainer_core.training import Trainer

    components = load_single_files(tiny_files["transformer_fp8_e4m3fn"], tiny_files["text_encoder_bf16"],
                                   tiny_files["vae"], storage="float8", compute_dtype=torch.bfloat16)
    dataset = cached_demo(components, demo_folder, tmp_path / "cache")
    monkeypatch.setenv("QWEN_LORA_HOST_RAM_GB", "4.5")  # 0.5 GiB usable after the 4 GiB left to the system
    before = bytes_read(tiny_files["transformer_fp8_e4m3fn"])
    with pytest.raises(UserInputError, match=r"host RAM: the \w+ phase needs .* are usable"):
        Trainer(components, dataset, LoraConfig(rank=4), OptimizerConfig(), TrainConfig(run_name="too-big"))
    assert bytes_read(tiny_files["transformer_fp8_e4m3fn"]) == before and components.transformer is None
