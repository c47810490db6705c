"""The catalogue of bad model and LoRA files and of non-finite values (issue 11, items 1 and 4).

Nothing non-finite is ever adopted or written: a LoRA file with NaN/inf is refused by name, a step that
makes the LoRA non-finite is undone from the newest finite checkpoint (or stops, saying there is none), a
checkpoint is never written with NaN/inf and resume passes over one that has them. Every malformed model or
LoRA file gives a `UserInputError` naming the file and the problem. README.md's troubleshooting table lists
each message.
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import REPO, adapter_snapshot, cached_demo
from trainer_core.training import checkpoint as ckpt
from trainer_core.runs import registry as runs
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import TrainingStopped, UserInputError
from trainer_core.adapters.lora_reading import read_lora_file
from trainer_core.families.qwen_image import build_tiny_components, load_diffusers_dir, load_single_files
from trainer_core.models import save_diffusers_dir
from trainer_core.training import Trainer

Q = "transformer_blocks.0.attn.to_q"  # a Linear of the tiny model: 32 -> 32
K = "transformer_blocks.0.attn.to_k"


def make(tmp_path, demo_folder, tiny_cache, run_dir="run", init_lora=None, lora=None, **train):
    components = build_tiny_components(storage="float32")
    cached = cached_demo(components, demo_folder, tiny_cache)
    settings = dict(run_name="numerics", checkpoint_every=1)
    settings.update(train)
    return Trainer(components, cached, lora or LoraConfig(rank=4, alpha=4.0, targets="attention"),
                   OptimizerConfig(optimizer="adamw", learning_rate=5e-3), TrainConfig(**settings),
                   run_dir=None if run_dir is None else tmp_path / run_dir, init_lora=init_lora)


def lora_file(path, tensors, metadata=None):
    save_file(tensors, str(path), metadata=metadata)
    return path


def lora_tensors(rank=2, module=Q, prefix="diffusion_model.", alpha=None, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    out = {f"{prefix}{module}.lora_A.weight": torch.randn(rank, 32, generator=g).to(dtype),
           f"{prefix}{module}.lora_B.weight": torch.randn(32, rank, generator=g).to(dtype)}
    if alpha is not None:
        out[f"{prefix}{module}.alpha"] = alpha
    return out


def checkpoint_steps(run_dir):
    root = ckpt.checkpoints_dir(run_dir)
    return sorted(int(p.name[5:]) for p in root.glob("step_*")) if root.is_dir() else []


class FaultyOptimizerStep:
    """Wraps a torch optimizer's step: after the real step number `at` (1-based call count), one LoRA value
    becomes NaN, as a numerically unstable update (or an 8-bit state overflow) would leave it."""

    def __init__(self, trainer, at):
        self.trainer, self.at, self.calls = trainer, at, 0
        self.real = trainer.built.optimizer.step
        trainer.built.optimizer.step = self

    def __call__(self, *args, **kwargs):
        out = self.real(*args, **kwargs)
        self.calls += 1
        if self.calls == self.at:
            with torch.no_grad():
                self.trainer.built.params[1].view(-1)[0] = float("nan")
        return out

    def remove(self):
        self.trainer.built.optimizer.step = self.real


# -- 1. non-finite values ---------------------------------------------------------------------------

def test_a_lora_file_with_nan_is_refused_naming_the_file_and_the_tensors(tmp_path, demo_folder, tiny_cache):
    tensors = {**lora_tensors(alpha=torch.tensor(2.0)), **lora_tensors(module=K, alpha=torch.tensor(2.0))}
    tensors[f"diffusion_model.{K}.lora_B.weight"][3, 1] = float("nan")
    tensors[f"diffusion_model.{Q}.lora_A.weight"][0, 0] = float("inf")
    path = lora_file(tmp_path / "poisoned.safetensors", tensors)
    with pytest.raises(UserInputError, match=rf"LoRA file {path} holds NaN or inf values in 2 tensors "
                                             rf".*{K}\.lora_B\.weight.*Choose an earlier LoRA file"):
        make(tmp_path, demo_folder, tiny_cache, init_lora=path)
    # Nothing was adopted, so nothing was written: no step-0 checkpoint full of NaN for a later run to resume.
    assert checkpoint_steps(tmp_path / "run") == []


def test_a_step_that_makes_the_lora_nonfinite_is_undone_from_the_newest_finite_checkpoint(
        tmp_path, demo_folder, tiny_cache):
    reference = make(tmp_path, demo_folder, tiny_cache, run_dir="reference", checkpoint_every=2)
    reference.train(5)
    t = make(tmp_path, demo_folder, tiny_cache, checkpoint_every=2)
    t.train(2)  # checkpoint of step 2
    fault = FaultyOptimizerStep(t, at=2)  # step 4 goes NaN inside the optimizer step
    with pytest.raises(TrainingStopped, match=r"optimizer step 4 made 1 LoRA tensors NaN/inf .* The LoRA and its "
                                              r"optimizer state were restored from the checkpoint of step 2 .*step_000002"
                                              r".*steps 3 to 4 are undone"):
        t.train(3)
    fault.remove()
    assert t.step == 2 and all(torch.isfinite(p).all() for p in t.built.params)
    assert checkpoint_steps(tmp_path / "run") == [2]  # nothing non-finite (nor step 3) was written
    # The whole state came back (LoRA, optimizer, RNG, data order): continuing equals a run that never failed.
    t.train(3)
    assert t.step == 5
    ref, now = adapter_snapshot(reference), adapter_snapshot(t)
    assert all(torch.equal(ref[k], now[k]) for k in ref)


def test_with_a_checkpoint_every_step_the_nonfinite_step_is_never_checkpointed(tmp_path, demo_folder, tiny_cache):
    """The issue's case: checkpoint_every=1, and the message claimed a restore that did not happen."""
    t = make(tmp_path, demo_folder, tiny_cache, checkpoint_every=1)
    t.train(2)
    FaultyOptimizerStep(t, at=1)
    with pytest.raises(TrainingStopped, match=r"optimizer step 3 made .* restored from the checkpoint of step 2.*"
                                              r"step 3 is undone"):
        t.train(2)
    assert checkpoint_steps(tmp_path / "run") == [1, 2]
    for step in (1, 2):
        tensors = load_file(str(ckpt.checkpoints_dir(tmp_path / "run") / f"step_{step:06d}" / "state.safetensors"))
        assert all(torch.isfinite(v).all() for v in tensors.values() if v.is_floating_point())


def test_a_nonfinite_step_with_no_checkpoint_stops_saying_so_and_writes_nothing(tmp_path, demo_folder, tiny_cache):
    t = make(tmp_path, demo_folder, tiny_cache, run_dir=None)
    FaultyOptimizerStep(t, at=1)
    with pytest.raises(TrainingStopped, match=r"optimizer step 1 made .* could not be undone: this trainer has no run "
                                              r"folder, so no checkpoint.*nothing was written"):
        t.train(2)
    assert t.step == 0
    with pytest.raises(TrainingStopped, match="could not be undone"):  # the broken LoRA is never trained on
        t.train(1)
    with pytest.raises(TrainingStopped, match="could not be undone"):  # nor saved
        t.save_lora(tmp_path / "broken.safetensors")
    assert not (tmp_path / "broken.safetensors").exists()

    # With a run folder but no checkpoint yet (the first step failed): the message says exactly that, and the
    # end-of-train checkpoint is not written.
    with_dir = make(tmp_path, demo_folder, tiny_cache, run_name="numerics2", checkpoint_every=0)
    FaultyOptimizerStep(with_dir, at=1)
    with pytest.raises(TrainingStopped, match=rf"could not be undone: its run folder {tmp_path / 'run'} holds no "
                                              r"checkpoint with finite values"):
        with_dir.train(2)
    assert checkpoint_steps(tmp_path / "run") == []
    with_dir.retire("done")  # a broken trainer can still be retired (nothing to checkpoint): a new run may start


def test_a_checkpoint_is_never_written_with_nonfinite_values(tmp_path, demo_folder, tiny_cache):
    t = make(tmp_path, demo_folder, tiny_cache)
    t.train(1)
    before = (ckpt.checkpoints_dir(tmp_path / "run") / "latest.json").read_text()
    with torch.no_grad():
        t.built.params[0].view(-1)[0] = float("nan")
    with pytest.raises(TrainingStopped, match=r"the checkpoint of step 1 was not written: 1 of its tensors hold NaN"):
        t.save_checkpoint()
    assert (ckpt.checkpoints_dir(tmp_path / "run") / "latest.json").read_text() == before


def poison_checkpoint(run_dir, step):
    file = ckpt.checkpoints_dir(run_dir) / f"step_{step:06d}" / "state.safetensors"
    tensors = load_file(str(file))
    name = next(k for k in tensors if k.startswith("lora."))
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, str(file))
    return name


def test_resume_passes_over_a_nonfinite_checkpoint_with_a_message(tmp_path, demo_folder, tiny_cache):
    """A NaN checkpoint (written by an older version, or damaged) is never resumed: the previous complete one
    is, and the run's status names the one passed over. With none left, the run starts over from the LoRA
    file now chosen, not from the NaN one."""
    t = make(tmp_path, demo_folder, tiny_cache)
    t.train(3)
    t.close()
    poisoned = poison_checkpoint(tmp_path / "run", 3)
    again = make(tmp_path, demo_folder, tiny_cache)
    assert again.resume() and again.step == 2
    assert len(again.resume_notes) == 1
    assert "step_000003 was skipped: 1 of its tensors hold NaN or inf values" in again.resume_notes[0]
    assert poisoned in again.resume_notes[0]
    again.close()

    poison_checkpoint(tmp_path / "run", 2)
    good = lora_file(tmp_path / "good.safetensors", {**lora_tensors(rank=4, alpha=torch.tensor(4.0)),
                                                     **lora_tensors(rank=4, module=K, alpha=torch.tensor(4.0))})
    components = build_tiny_components(storage="float32")
    opened = runs.open_run(components, cached_demo(components, demo_folder, tiny_cache),
                           LoraConfig(rank=4, alpha=4.0), OptimizerConfig(optimizer="adamw", learning_rate=5e-3),
                           TrainConfig(run_name="numerics_open", checkpoint_every=1), run_dir=tmp_path / "run",
                           init_lora=good)
    try:
        assert opened.action == "started" and opened.trainer.step == 0
        assert "step_000003 was skipped" in opened.status and "step_000002 was skipped" in opened.status
        assert torch.equal(opened.trainer.built.transformer.get_submodule(Q).lora_A["default"].weight,
                           load_file(str(good))[f"diffusion_model.{Q}.lora_A.weight"])
    finally:
        runs.release("numerics_open")


def test_resume_passes_over_incomplete_or_unreadable_checkpoints_and_a_pointer_out_of_the_run(
        tmp_path, demo_folder, tiny_cache):
    t = make(tmp_path, demo_folder, tiny_cache)
    t.train(3)
    t.close()
    root = ckpt.checkpoints_dir(tmp_path / "run")
    tensors = load_file(str(root / "step_000003" / "state.safetensors"))
    dropped = next(k for k in tensors if k.startswith("optim"))
    save_file({k: v for k, v in tensors.items() if k != dropped}, str(root / "step_000003" / "state.safetensors"))
    (root / "step_000002" / "state.json").write_text("{cut sho")
    again = make(tmp_path, demo_folder, tiny_cache)
    assert not again.resume() and again.step == 0  # before: a raw KeyError from the step-3 checkpoint
    assert "step_000003 was skipped: it lacks 1 tensors" in again.resume_notes[0] and dropped in again.resume_notes[0]
    assert "step_000002 was skipped: it cannot be read" in again.resume_notes[1]
    again.close()
    # latest.json pointing outside the run's checkpoints is not followed.
    other = make(tmp_path, demo_folder, tiny_cache, run_dir="elsewhere")
    other.train(1)
    other.close()
    (root / "latest.json").write_text(json.dumps({"dir": str(tmp_path / "elsewhere" / "checkpoints" / "step_000001"),
                                                  "step": 1}))
    third = make(tmp_path, demo_folder, tiny_cache)
    assert not third.resume() and third.step == 0


def test_the_stop_after_nonfinite_losses_names_the_lora_file_and_claims_no_restore(tmp_path, demo_folder, tiny_cache):
    good = lora_file(tmp_path / "start.safetensors", lora_tensors(rank=4, alpha=torch.tensor(4.0)))
    t = make(tmp_path, demo_folder, tiny_cache, init_lora=good, max_nonfinite_steps=2)
    t.train(1)
    for s in t.dataset.samples:  # every latent poisoned in memory: every loss is NaN
        t.dataset._memory[(s.latent_key, "latents")] = torch.full_like(t.dataset.latents(s.latent_key), float("nan"))
    with pytest.raises(TrainingStopped) as stopped:
        t.train(3)
    message = str(stopped.value)
    assert "2 steps in a row had a NaN/inf loss" in message and "unchanged since step 1" in message
    assert f"This run continued from LoRA file {good}" in message
    assert "restored" not in message


# -- 4. malformed model and LoRA files --------------------------------------------------------------

def bad_lora_files():
    """(id, tensors, metadata, message pattern): each failed before with a raw error, a wrong message or
    silence, and now names the file and the problem."""
    two = {**lora_tensors(alpha=torch.tensor(float("nan"))), **lora_tensors(module=K, alpha=torch.tensor(float("nan")))}
    dup = {**lora_tensors(), **lora_tensors(prefix="transformer.")}
    return [
        ("alpha with two elements", lora_tensors(alpha=torch.tensor([1.0, 2.0])), None,
         rf"{Q}\.alpha has 2 elements \(shape \(2,\)\); an alpha is one number"),
        ("NaN alpha", two, None, r"attn\.to_[qk]\.alpha is nan; alpha must be a positive finite number"),
        ("empty alpha", lora_tensors(alpha=torch.tensor([])), None, r"alpha has 0 elements"),
        ("bool alpha", lora_tensors(alpha=torch.tensor(True)), None, r"alpha has dtype torch.bool"),
        ("int tensors", lora_tensors(dtype=torch.int32), None, r"stores LoRA weights as \['int32'\] .*floating-point"),
        ("bool tensors", lora_tensors(dtype=torch.bool), None, r"stores LoRA weights as \['bool'\]"),
        ("uint8 tensors", lora_tensors(dtype=torch.uint8), None, r"stores LoRA weights as \['uint8'\]"),
        ("same module in two layouts", dup, None, rf"holds {Q}'s lora_A twice \(diffusion_model\.{Q}\.lora_A\.weight "
                                                  rf"and transformer\.{Q}\.lora_A\.weight\)"),
        ("alpha on some modules only", {**lora_tensors(alpha=torch.tensor(8.0)), **lora_tensors(module=K)}, None,
         rf"has \.alpha keys for 1 of 2 modules \(first without: \['{K}'\]\): loaders scale the modules with one by "
         r"alpha / rank = 4 and the others by 1"),
        ("1-D lora_B", {f"{Q}.lora_A.weight": torch.randn(2, 32), f"{Q}.lora_B.weight": torch.randn(32)}, None,
         r"do not form a Linear LoRA .*lora_B \(32,\)"),
        ("3-D lora_B", {f"{Q}.lora_A.weight": torch.randn(2, 32), f"{Q}.lora_B.weight": torch.randn(32, 2, 1)}, None,
         r"do not form a Linear LoRA .*lora_B \(32, 2, 1\)"),
        ("non-numeric alpha metadata", lora_tensors(prefix="transformer."),
         {"qwen_lora.alpha": "sixteen", "qwen_lora.lora_B_scale": "1.0"}, r"metadata qwen_lora.alpha='sixteen'"),
        ("non-numeric B scale metadata", lora_tensors(prefix="transformer."),
         {"qwen_lora.alpha": "2.0", "qwen_lora.lora_B_scale": "half"}, r"metadata qwen_lora.lora_B_scale='half'"),
        ("adapter metadata not JSON", lora_tensors(prefix="transformer."), {"lora_adapter_metadata": "{oops"},
         r"lora_adapter_metadata that is not a JSON object"),
        ("adapter metadata a list", lora_tensors(prefix="transformer."), {"lora_adapter_metadata": "[16]"},
         r"lora_adapter_metadata that is not a JSON object"),
        ("non-numeric adapter alpha", lora_tensors(prefix="transformer."),
         {"lora_adapter_metadata": json.dumps({"lora_alpha": "big"})}, r"lora_adapter_metadata lora_alpha='big'"),
    ]


@pytest.mark.parametrize("tensors, metadata, pattern", [c[1:] for c in bad_lora_files()],
                         ids=[c[0] for c in bad_lora_files()])
def test_malformed_lora_files_are_refused_naming_the_file_and_the_problem(tmp_path, tensors, metadata, pattern):
    path = lora_file(tmp_path / "bad.safetensors", tensors, metadata)
    with pytest.raises(UserInputError, match=rf"LoRA file {path}:? .*{pattern}"):
        read_lora_file(path)


def test_a_rank_zero_lora_file_blames_the_file_not_the_lora_config(tmp_path, demo_folder, tiny_cache):
    path = lora_file(tmp_path / "rank0.safetensors", lora_tensors(rank=0, alpha=torch.tensor(1.0)))
    with pytest.raises(UserInputError, match=rf"LoRA file {path} has rank 0 .* Choose another LoRA file") as error:
        make(tmp_path, demo_folder, tiny_cache, init_lora=path)
    assert "LoRA rank=" not in str(error.value)


def test_a_lora_file_whose_values_overflow_the_lora_dtype_is_refused(tmp_path, demo_folder, tiny_cache):
    """Finite in the file (float64), inf once cast to the float32 adapter: refused, not adopted."""
    tensors = lora_tensors(rank=4, alpha=torch.tensor(4.0), dtype=torch.float64)
    tensors[f"diffusion_model.{Q}.lora_A.weight"][0, 0] = 1e300
    path = lora_file(tmp_path / "huge.safetensors", tensors)
    with pytest.raises(UserInputError, match=rf"LoRA file {path} holds values too large for LoRA dtype float32"):
        make(tmp_path, demo_folder, tiny_cache, init_lora=path)
    assert checkpoint_steps(tmp_path / "run") == []


def test_a_folder_chosen_as_lora_file_is_called_a_folder(tmp_path):
    (tmp_path / "folder.safetensors").mkdir()
    with pytest.raises(UserInputError, match=r"folder\.safetensors is a folder, not a file"):
        read_lora_file(tmp_path / "folder.safetensors")


def test_float8_lora_tensors_are_read(tmp_path):
    """float8 is a floating-point format (some tools store LoRAs in it): read and used as its values."""
    lora = read_lora_file(lora_file(tmp_path / "fp8.safetensors", lora_tensors(dtype=torch.float8_e4m3fn)))
    assert lora.rank == 2 and lora.weights[Q][0].dtype == torch.float8_e4m3fn


@pytest.fixture(scope="module")
def diffusers_folder(tmp_path_factory):
    return save_diffusers_dir(build_tiny_components(storage="float32"), tmp_path_factory.mktemp("model") / "tiny")


def damaged_copy(diffusers_folder, tmp_path, damage):
    folder = tmp_path / "copy"
    shutil.copytree(diffusers_folder, folder)
    damage(folder)
    return folder


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


def edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def to_dtype(path, dtype, which):
    tensors = load_file(str(path))
    save_file({k: v.to(dtype) if which(k) else v for k, v in tensors.items()}, str(path))


@pytest.mark.parametrize("damage, pattern", [
    (lambda f: truncate(f / "transformer" / "diffusion_pytorch_model.safetensors"),
     r"transformer weights file .*copy/transformer/diffusion_pytorch_model\.safetensors is not a readable \.safetensors "
     r"file .*cut short"),
    (lambda f: truncate(next((f / "text_encoder").glob("*.safetensors"))),
     r"text_encoder weights file .*copy/text_encoder/.*\.safetensors is not a readable"),
    (lambda f: truncate(next((f / "vae").glob("*.safetensors"))), r"vae weights file .*copy/vae/.* is not a readable"),
    (lambda f: (f / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b""),
     r"diffusion_pytorch_model\.safetensors is not a readable .*header too small"),
    (lambda f: (f / "transformer" / "config.json").unlink(),
     r"model folder .*copy lacks transformer/config\.json \(the transformer's config\)"),
    (lambda f: (f / "transformer" / "config.json").write_text("{oops"),
     r"copy/transformer/config\.json \(the transformer's config\) is not valid JSON"),
    (lambda f: (f / "transformer" / "config.json").write_text("[1]"), r"config\.json .* is not a JSON object"),
    (lambda f: (f / "transformer" / "config.json").write_text(json.dumps({
        **json.loads((f / "transformer" / "config.json").read_text()), "num_layers": "two"})),
     r"copy/transformer/config\.json does not describe a Qwen-Image transformer \(TypeError"),
    (lambda f: (f / "vae" / "config.json").unlink(), r"model folder .*copy lacks vae/config\.json"),
    # Without its config (or with the 7B model's beside small weights) transformers built a 7B model first:
    # a raw error after allocating ~28 GB, or the process killed for memory.
    (lambda f: (f / "text_encoder" / "config.json").unlink(), r"model folder .*copy lacks text_encoder/config\.json"),
    (lambda f: edit_json(f / "text_encoder" / "config.json", lambda c: c["text_config"].update(hidden_size=3584)),
     r"text_encoder/config\.json says \{'vocab_size': 400, 'hidden_size': 3584\}, but the weights' "
     r"model\.embed_tokens\.weight is \(400, 16\)"),
    (lambda f: edit_json(f / "vae" / "config.json", lambda c: c.update(base_dim="wide")),
     r"model folder .*copy: vae/ could not be loaded \(TypeError"),
    (lambda f: (f / "scheduler" / "scheduler_config.json").write_text("{"), r"scheduler_config\.json .* not valid JSON"),
    (lambda f: [p.unlink() for p in (f / "tokenizer").iterdir()], r"tokenizer folder .*copy/tokenizer lacks the tokens"),
    (lambda f: to_dtype(f / "transformer" / "diffusion_pytorch_model.safetensors", torch.int8,
                        lambda k: k.endswith("attn.to_q.weight")),
     r"transformer weights file .* stores 2 weights as \['I8'\] .*transformer_blocks\.0\.attn\.to_q\.weight"),
], ids=["truncated transformer", "truncated text encoder", "truncated vae", "empty transformer file",
        "no transformer config", "config not JSON", "config a list", "config with a bad value", "no vae config",
        "no text encoder config", "text encoder config of another size", "vae config with a bad value",
        "scheduler config not JSON", "empty tokenizer folder", "int8 transformer weights"])
def test_malformed_diffusers_folders_are_refused_naming_the_file(diffusers_folder, tmp_path, damage, pattern):
    folder = damaged_copy(diffusers_folder, tmp_path, damage)
    with pytest.raises(UserInputError, match=pattern):
        load_diffusers_dir(folder, storage="float32", compute_dtype=torch.float32)


@pytest.mark.parametrize("part, dtype, which, pattern", [
    ("transformer_bf16", torch.int8, lambda k: k.endswith("0.attn.to_q.weight"),
     r"transformer file .*qwen_image_tiny_bf16\.safetensors stores 1 weights as \['I8'\]"),
    ("transformer_bf16", torch.int32, lambda k: k == "img_in.bias", r"stores 1 weights as \['I32'\] \(first: \['img_in"),
    ("text_encoder_bf16", torch.int8, lambda k: "q_proj.weight" in k, r"text encoder file .* stores 2 weights as \['I8'\]"),
    ("vae", torch.int16, lambda k: k == "conv1.weight", r"vae file .* stores 1 weights as \['I16'\]"),
    ("transformer_bf16", torch.bool, lambda k: k.endswith("norm_q.weight"), r"\['BOOL'\]"),
], ids=["int8 transformer weight", "int32 transformer bias", "int8 text encoder", "int16 vae", "bool transformer"])
def test_integer_weights_in_single_files_are_refused(tiny_files, tmp_path, part, dtype, which, pattern):
    copies = single_file_copies(tiny_files, tmp_path)
    to_dtype(copies[part], dtype, which)
    with pytest.raises(UserInputError, match=pattern + r".*Choose the bf16, fp8"):
        load_single_files(copies["transformer_bf16"], copies["text_encoder_bf16"], copies["vae"],
                          tokenizer_dir=tiny_files["tokenizer"], storage="float32", compute_dtype=torch.float32)


def single_file_copies(tiny_files, tmp_path, names=("transformer_bf16", "text_encoder_bf16", "vae")):
    copies = {}
    for name in names:
        copies[name] = tmp_path / tiny_files[name].name
        shutil.copy(tiny_files[name], copies[name])
        sidecar = tiny_files[name].with_suffix(".json")
        if sidecar.is_file():
            shutil.copy(sidecar, copies[name].with_suffix(".json"))
    return copies


def nan_first_scale(path):
    tensors = load_file(str(path))
    key = sorted(k for k in tensors if k.endswith("scale_weight"))[0]
    tensors[key] = torch.tensor(float("nan"))
    save_file(tensors, str(path))


@pytest.mark.parametrize("transformer, text_encoder, damaged, damage, pattern", [
    ("transformer_fp8_e4m3fn_scaled", "text_encoder_bf16", "transformer_fp8_e4m3fn_scaled", nan_first_scale,
     r"transformer file .*_fp8_e4m3fn_scaled\.safetensors has NaN or inf weight scales \(1, first: \['img_in\.scale_weight'\]\)"),
    ("transformer_bf16", "text_encoder_fp8_scaled", "text_encoder_fp8_scaled", nan_first_scale,
     r"text encoder file .*_fp8_scaled\.safetensors has NaN or inf weight scales"),
    ("transformer_bf16", "text_encoder_bf16", "transformer_bf16",
     lambda p: edit_json(p.with_suffix(".json"), lambda c: c["config"].update(axes_dims_rope=[2, 2, 2])),
     r"config JSON beside .*tiny_bf16\.safetensors has axes_dims_rope=\[2, 2, 2\]: it must be whole numbers summing"),
    ("transformer_bf16", "text_encoder_bf16", "transformer_bf16",
     lambda p: edit_json(p.with_suffix(".json"), lambda c: c["config"].update(axes_dims_rope="abc")),
     r"axes_dims_rope='abc'"),
], ids=["NaN transformer scale", "NaN text encoder scale", "RoPE axes not summing to the head size",
        "RoPE axes not a list"])
def test_damaged_scales_and_sidecar_configs_are_refused(tiny_files, tmp_path, transformer, text_encoder, damaged,
                                                        damage, pattern):
    """Before: NaN weights loaded silently (every step then skipped), or a raw error at the first forward."""
    copies = single_file_copies(tiny_files, tmp_path, (transformer, text_encoder, "vae"))
    damage(copies[damaged])
    with pytest.raises(UserInputError, match=pattern):
        load_single_files(copies[transformer], copies[text_encoder], copies["vae"], tokenizer_dir=tiny_files["tokenizer"],
                          storage="float32", compute_dtype=torch.float32)


@pytest.mark.parametrize("key, value", [("latents_mean", [0.0]), ("latents_std", "x"), ("latents_std", [0.0] * 4)])
def test_a_vae_sidecar_with_unusable_latent_statistics_is_refused(tiny_files, tmp_path, key, value):
    copies = single_file_copies(tiny_files, tmp_path)
    edit_json(copies["vae"].with_suffix(".json"), lambda c: c["config"].update({key: value}))
    with pytest.raises(UserInputError, match=rf"config JSON beside .*vae\.safetensors has {key}=.*: it must be 4 "
                                             r"finite numbers"):
        load_single_files(copies["transformer_bf16"], copies["text_encoder_bf16"], copies["vae"],
                          tokenizer_dir=tiny_files["tokenizer"], storage="float32", compute_dtype=torch.float32)


def test_the_troubleshooting_page_lists_every_message_of_this_catalogue():
    section = (REPO / "docs" / "troubleshooting.md").read_text()
    for topic in ("holds NaN or inf values", "made", "could not be undone", "was not written", "was skipped",
                  "an alpha is one number", "alpha must be a positive finite number", "stores LoRA weights as",
                  "twice", "has rank 0", "do not form a Linear LoRA", "which is not a number",
                  "not a readable .safetensors file", "lacks transformer/config.json", "is not valid JSON",
                  "could not be loaded", "not as floating-point numbers", "too large for LoRA dtype",
                  "has .alpha keys for", "but the weights'", "weight scales", "axes_dims_rope", "latents_mean"):
        assert topic in section, topic


def test_blocks_stored_differently_are_refused_by_name_when_streamed():
    """A transformer file that quantises some blocks and not others loads (each Linear as its file has it), but its
    streamed blocks would share one ring of slots: Init is refused naming blocks_to_swap and what to do, before
    anything trains."""
    from trainer_core.core.errors import UserInputError
    from trainer_core.models.float8.storage import quantize_weight
    from trainer_core.models.streaming import assign_frozen_linear_weight
    from trainer_core.families import get_family
    from trainer_core.models.float8 import frozen_linears
    from trainer_core.streaming.runner import BlockRunner, swapped_blocks

    components = get_family("qwen-image").tiny_components(seed=0, storage="float32")
    blocks = components.transformer.transformer_blocks
    first, *_ = swapped = swapped_blocks(len(blocks), 2)
    for _, linear in frozen_linears(blocks[first]):  # one streamed block in float8, the other left in float32
        stored, scale = quantize_weight(linear.weight.data.float(), "float8")
        assign_frozen_linear_weight(linear, stored, scale)
    with pytest.raises(UserInputError) as error:
        BlockRunner(components.transformer, torch.device("cpu"), blocks_to_swap=2)
    message = str(error.value)
    assert message.startswith("blocks_to_swap: the transformer's blocks are stored differently")
    assert f"block {first}'s Linears in float8_e4m3fn" in message and f"block {swapped[1]}'s in float32" in message
    assert "Set blocks_to_swap to 0" in message
