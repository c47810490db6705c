"""A failing disk, in every place we write: real errors from real disks wherever this machine allows.

- A full disk is a real small tmpfs filled to the last byte (needs root and `mount`; skipped otherwise):
  safetensors then raises its own `SafetensorError` ("... (os error 28)"), which used to reach the user raw.
- A read-only disk is that tmpfs remounted read-only (EROFS); an immutable folder (`chattr +i`) gives EPERM
  even to root.
- No permission (EACCES) and a file size limit (EFBIG) run in one subprocess (as root: with root's override
  capabilities dropped by `setpriv`, since root ignores folder permissions otherwise) that sets RLIMIT_FSIZE.
- A disk quota (EDQUOT) is the one faked error: this kernel's tmpfs has no quota support. The library
  function is replaced by one raising the library's own error type with its real message format.
- Leftovers of killed writes come from a real writer killed mid-write (SIGKILL), or are made with exactly
  the writers' names (a checkpoint folder's rename cannot be interrupted on cue).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from conftest import REPO, cached_demo
from trainer_core.training import checkpoint as ckpt
from trainer_core.core import files
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.core.errors import UserInputError
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.training import Trainer


pytestmark = pytest.mark.skipif(os.name == "nt", reason="POSIX mounts, permissions and signals")


# -- disks ------------------------------------------------------------------------------------------

def _run(*cmd: str) -> bool:
    return subprocess.run(cmd, capture_output=True).returncode == 0


class Disk:
    """A real tmpfs of `size` mounted at `path`."""

    def __init__(self, path: Path, size: str):
        self.path = path
        path.mkdir(parents=True)
        if os.geteuid() != 0 or not _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)):
            pytest.skip("needs root and `mount -t tmpfs` to make a real small disk")
        self.filler = path / "filler"

    def fill(self) -> None:
        """Write until the disk says ENOSPC: not one byte is free afterwards."""
        with open(self.filler, "ab", buffering=0) as f:
            for size in (1 << 20, 1 << 12, 1):
                try:
                    while True:
                        f.write(b"\0" * size)
                except OSError as e:
                    assert e.errno == 28

    def free(self) -> None:
        self.filler.unlink()

    @staticmethod
    @contextlib.contextmanager
    def read_only(*folders: Path):
        """Each folder becomes a read-only view of itself (a read-only bind mount over it), for the block."""
        done = []
        try:
            for folder in folders:
                folder.mkdir(parents=True, exist_ok=True)
                assert _run("mount", "--bind", str(folder), str(folder))
                done.append(folder)
                assert _run("mount", "-o", "remount,bind,ro", str(folder))
            yield
        finally:
            for folder in reversed(done):
                _run("umount", str(folder))

    def unmount(self) -> None:
        _run("umount", "-l", str(self.path))


@pytest.fixture
def disk(tmp_path):
    disks = []

    def make(size: str = "4M", name: str = "disk") -> Disk:
        disks.append(Disk(tmp_path / name, size))
        return disks[-1]

    yield make
    for d in disks:
        d.unmount()


def make_trainer(cache_dir, demo_folder, run_dir=None, run_name="disk"):
    components = build_tiny_components(seed=0, storage="float32")
    cached = cached_demo(components, demo_folder, cache_dir)
    return Trainer(components, cached, LoraConfig(rank=4, alpha=4.0, targets="all"),
                   OptimizerConfig(learning_rate=1e-3), TrainConfig(run_name=run_name, seed=0), run_dir=run_dir)


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# -- a real full disk ---------------------------------------------------------------------------------

def test_real_full_disk_while_checkpointing(disk, tiny_cache, demo_folder):
    d = disk()
    t = make_trainer(tiny_cache, demo_folder, run_dir=d.path / "run")
    t.train(2)
    root = ckpt.checkpoints_dir(d.path / "run")
    before = (root / "step_000002" / "state.safetensors").read_bytes()
    d.fill()
    with pytest.raises(UserInputError, match=r"^the disk is full: the checkpoint of step 3 could not be written to "
                                             r".*checkpoints\. The trainer still holds step 3 in memory\. Free some "
                                             r"space and run again\.$"):
        t.train(1)
    assert t.step == 3
    assert (root / "step_000002" / "state.safetensors").read_bytes() == before
    assert json.loads((root / "latest.json").read_text())["step"] == 2
    assert listing(root) == ["latest.json", "step_000002"]  # no half-written folder left
    d.free()
    t.train(1)
    assert json.loads((root / "latest.json").read_text())["step"] == 4
    t.close()


def test_real_full_disk_while_saving_a_lora_over_an_existing_one(disk, trained_lora):
    d = disk()
    path = d.path / "loras" / "mine.safetensors"
    trained_lora.save_lora(path)
    before = path.read_bytes()
    d.fill()
    with pytest.raises(UserInputError, match=r"^the disk is full: the LoRA file could not be written to .*mine\."
                                             r"safetensors\. Any earlier mine.safetensors is intact and the trainer "
                                             r"still holds step 4\. Free some space and run again\.$"):
        trained_lora.save_lora(path)
    assert path.read_bytes() == before
    assert listing(path.parent) == ["mine.safetensors"]


def test_real_full_disk_while_caching_then_the_rest(disk, demo_folder):
    d = disk()
    cache = d.path / "cache"
    d.fill()
    d.filler.write_bytes(b"\0" * (d.filler.stat().st_size - 24 * 1024))  # room for a few entries only
    with pytest.raises(UserInputError, match=r"^the disk is full: the cache entry of (image|prompt) .* could not be "
                                             r"written to .*cache/(latents|text)\. The \d+ entries encoded before it "
                                             r"are kept: the next run encodes only the rest\. Free some space"):
        cached_demo(build_tiny_components(seed=0, storage="float32"), demo_folder, cache)
    written = len(list(cache.rglob("*.safetensors")))
    assert 0 < written < 8 + 9
    assert not [p for p in cache.rglob("*") if p.name.endswith(".tmp")]
    d.free()
    report = cached_demo(build_tiny_components(seed=0, storage="float32"), demo_folder, cache).report
    assert report.latents_encoded + report.prompts_encoded == 8 + 9 - written


def test_the_library_raises_its_own_error_type_on_a_real_full_disk(disk):
    """What all the above is about: safetensors' `save_file` raises `SafetensorError`, not `OSError`, on a
    real ENOSPC; `files.save_safetensors` turns it into the OSError it names."""
    from safetensors.torch import save_file

    d = disk("64k")
    d.fill()
    with pytest.raises(SafetensorError, match=r"No space left on device \(os error 28\)"):
        save_file({"a": torch.zeros(4096)}, str(d.path / "raw.safetensors"))
    with pytest.raises(OSError) as caught:
        files.save_safetensors({"a": torch.zeros(4096)}, d.path / "ours.safetensors")
    assert caught.value.errno == 28 and isinstance(caught.value.__cause__, SafetensorError)


# -- a read-only disk, an immutable folder ------------------------------------------------------------

def test_real_read_only_disk(disk, trained_lora, tiny_cache, demo_folder):
    d = disk()
    t = make_trainer(tiny_cache, demo_folder, run_dir=d.path / "run")
    t.train(1)
    lora = d.path / "loras" / "mine.safetensors"
    trained_lora.save_lora(lora)
    before = lora.read_bytes()
    cached_demo(build_tiny_components(seed=0, storage="float32"), demo_folder, d.path / "cache")
    with d.read_only(ckpt.checkpoints_dir(d.path / "run"), lora.parent, d.path / "cache", d.path / "ro"):
        readonly = r"^the disk is read-only: the {} could not be written to .*Choose a folder on a writable disk"
        with pytest.raises(UserInputError, match=readonly.format("checkpoint of step 2")):
            t.train(1)
        with pytest.raises(UserInputError, match=readonly.format("LoRA file")):
            trained_lora.save_lora(lora)
        assert lora.read_bytes() == before
        with pytest.raises(UserInputError, match=r"^the disk is read-only: the lock file of run 'other' could not be "
                                                 r"written to .*other\. Nothing was trained or changed\. Choose"):
            make_trainer(tiny_cache, demo_folder, run_dir=d.path / "ro" / "other", run_name="other")
        with pytest.raises(UserInputError, match=readonly.format(r"cache entry of image \S+")):
            cached_demo(build_tiny_components(seed=0, storage="float32"), demo_folder, d.path / "ro" / "cache")
        # A complete cache on a read-only disk is still used: reading needs no writes.
        report = cached_demo(build_tiny_components(seed=0, storage="float32"), demo_folder, d.path / "cache").report
        assert report.latents_reused == 8
    t.train(1)
    assert json.loads((ckpt.checkpoints_dir(d.path / "run") / "latest.json").read_text())["step"] == 3
    t.close()


def test_real_immutable_folder_gives_eperm(disk, trained_lora):
    d = disk()
    folder = d.path / "loras"
    folder.mkdir()
    if not _run("chattr", "+i", str(folder)):
        pytest.skip("chattr +i is not available here")
    try:
        with pytest.raises(UserInputError, match=r"^no permission to write: the LoRA file could not be written to "
                                                 r".*Make the folder writable for the user that runs ComfyUI"):
            trained_lora.save_lora(folder / "x.safetensors")
    finally:
        _run("chattr", "-i", str(folder))


# -- no permission and a file size limit, for real, in a process without root's override -----------------

PERMISSION_WORKER = textwrap.dedent("""
    import json, os, resource, sys
    from pathlib import Path
    sys.path.insert(0, {repo!r}); sys.path.insert(0, {tests!r})
    from trainer_core.runs.startup import load_engine
    load_engine()  # the imports, as a training process makes them
    from conftest import cached_demo
    from trainer_core.core.errors import UserInputError
    from test_bad_disk import make_trainer
    from trainer_core.families.qwen_image import build_tiny_components
    work, data, cache = Path({work!r}), {data!r}, {cache!r}
    messages = {{}}

    def attempt(name, fn):
        try:
            fn()
            messages[name] = "no error"
        except UserInputError as e:
            messages[name] = "UserInputError: " + str(e)
        except BaseException as e:
            messages[name] = f"raw {{type(e).__name__}}: {{e}}"

    t = make_trainer(cache, data, run_dir=work / "run")
    t.train(1)
    t.save_lora(work / "loras" / "mine.safetensors")
    for folder in (work / "run" / "checkpoints", work / "loras", work / "locked"):
        folder.mkdir(exist_ok=True)
        folder.chmod(0o555)
    attempt("checkpoint", lambda: t.train(1))
    attempt("lora", lambda: t.save_lora(work / "loras" / "mine.safetensors"))
    attempt("cache", lambda: cached_demo(build_tiny_components(seed=0, storage="float32"), data, work / "locked" / "c"))
    attempt("run folder", lambda: make_trainer(cache, data, run_dir=work / "locked" / "run", run_name="other"))
    (work / "run" / "checkpoints").chmod(0o755); (work / "loras").chmod(0o755)
    t.train(1)  # permission back: training goes on
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    attempt("too large", lambda: t.save_lora(work / "loras" / "big.safetensors"))
    attempt("too large checkpoint", lambda: t.train(1))
    t.close()
    print("RESULT" + json.dumps(messages))
""")


def test_real_permission_denied_and_file_too_large(tmp_path, tiny_cache, demo_folder):
    """EACCES from a 0o555 folder and EFBIG from RLIMIT_FSIZE, both real, in one subprocess (imports cost)."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop root's permission override")
    make_trainer(tiny_cache, demo_folder).close()  # the cache entries exist, so the worker only reads them
    script = PERMISSION_WORKER.format(repo=str(REPO), tests=str(REPO / "tests"), work=str(tmp_path),
                                      data=str(demo_folder), cache=str(tiny_cache))
    drop = "-dac_override,-dac_read_search,-fowner,-linux_immutable,-sys_resource"
    as_root = ["setpriv", f"--bounding-set={drop}", "--inh-caps=-all"] if os.geteuid() == 0 else []
    result = subprocess.run([*as_root, sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            cwd=REPO)
    assert "RESULT" in result.stdout, result.stderr[-3000:]
    messages = json.loads(result.stdout.split("RESULT", 1)[1])
    for name, what in (("checkpoint", "checkpoint of step 2"), ("lora", "LoRA file"),
                       ("cache", "cache entry of image 00_red_circle.png"), ("run folder", "lock file of run 'other'")):
        assert messages[name].startswith(f"UserInputError: no permission to write: the {what} could not be written"), \
            (name, messages[name])
    assert messages["too large"].startswith("UserInputError: the file is too large: the LoRA file could not be "
                                            "written"), messages["too large"]
    assert "ulimit -f" in messages["too large"] and "Any earlier big.safetensors is intact" in messages["too large"]
    assert messages["too large checkpoint"].startswith("UserInputError: the file is too large: the checkpoint of "
                                                       "step 4"), messages["too large checkpoint"]
    assert load_file(str(tmp_path / "loras" / "mine.safetensors"))  # the earlier file is whole
    assert json.loads((tmp_path / "run" / "checkpoints" / "latest.json").read_text())["step"] == 3
    assert not (tmp_path / "loras" / "big.safetensors").exists()


# -- a disk quota (the one faked error: the library's own type and message format) ----------------------

def test_disk_quota_exceeded(trained_lora, tmp_path, monkeypatch):
    path = tmp_path / "mine.safetensors"
    trained_lora.save_lora(path)
    before = path.read_bytes()

    def quota(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half")
        raise SafetensorError("Error while serializing: I/O error: Disk quota exceeded (os error 122)")

    monkeypatch.setattr(files, "save_file", quota)
    with pytest.raises(UserInputError, match=r"^the disk quota is used up: the LoRA file could not be written .*"
                                             r"Any earlier mine.safetensors is intact.*larger quota"):
        trained_lora.save_lora(path)
    assert path.read_bytes() == before and listing(tmp_path) == ["mine.safetensors"]


# -- things in the way -----------------------------------------------------------------------------------

def test_a_cache_folder_that_is_a_file(demo_folder, tmp_path):
    (tmp_path / "cache").write_text("not a folder")
    with pytest.raises(UserInputError, match=r"^a file is in the way: the cache entry of image .* could not be "
                                             r"written .*Move or rename it, or choose another folder\.$"):
        cached_demo(build_tiny_components(seed=0, storage="float32"), demo_folder, tmp_path / "cache")
    assert (tmp_path / "cache").read_text() == "not a folder"


def test_a_lora_path_that_is_a_folder(trained_lora, tmp_path):
    (tmp_path / "mine.safetensors").mkdir()
    with pytest.raises(UserInputError, match=r"^a file is in the way: the LoRA file could not be written"):
        trained_lora.save_lora(tmp_path / "mine.safetensors")
    assert listing(tmp_path) == ["mine.safetensors"] and (tmp_path / "mine.safetensors").is_dir()


def test_demo_outputs_are_written_atomically_with_the_documented_messages(tmp_path):
    from trainer_core.runs.demo import run_demo

    (tmp_path / "loss.png").mkdir()  # something in the way of the last outputs
    with pytest.raises(UserInputError, match=r"^a file is in the way: the loss plot could not be written to .*loss"
                                             r"\.png.*the run's checkpoint holds step 1"):
        run_demo(tmp_path, steps=1, log=lambda *_: None)
    assert (tmp_path / "preview.png").stat().st_size > 0 and (tmp_path / "demo_lora.safetensors").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_run_folder_deleted_mid_run(tiny_cache, demo_folder, tmp_path):
    t = make_trainer(tiny_cache, demo_folder, run_dir=tmp_path / "run")
    t.train(1)
    shutil.rmtree(tmp_path / "run")
    t.train(1)  # the checkpoint goes where it belongs again
    assert json.loads((ckpt.checkpoints_dir(tmp_path / "run") / "latest.json").read_text())["step"] == 2
    t.close()


# -- leftovers of killed writes --------------------------------------------------------------------------

KILLED_WRITER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {repo!r})
    from trainer_core.core.files import write_safetensors_atomic
    write_safetensors_atomic({{"x": torch.zeros(100_000_000)}}, sys.argv[1])  # 400 MB: long enough to be killed
""")


def kill_mid_write(target: Path) -> Path:
    """Start a real atomic write of `target` in a new process and SIGKILL it while the library's temporary file
    grows; returns what it left: our `.NAME.PID.tmp` folder, with safetensors' own `.tmpXXXXXX` inside."""
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER.format(repo=str(REPO)), str(target)], cwd=REPO)
    scratch = target.with_name(f".{target.name}.{proc.pid}.tmp")

    def growing() -> bool:
        with contextlib.suppress(OSError):
            return any(p.stat().st_size > 0 for p in scratch.iterdir())
        return False

    deadline = time.monotonic() + 120
    while not growing() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert scratch.is_dir() and not target.exists(), "the writer finished before it could be killed"
    assert [p.name for p in scratch.iterdir()][0].startswith(".tmp")  # safetensors' own temporary file
    return scratch


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_leftovers_of_a_killed_lora_save_go_at_the_next_save(trained_lora, tmp_path):
    loras = tmp_path / "loras"
    loras.mkdir()
    leftover = kill_mid_write(loras / "mine.safetensors")
    live = subprocess.Popen(["sleep", "60"])  # a save in progress in another process is not a leftover
    try:
        theirs = loras / f".other.safetensors.{live.pid}.tmp"
        # A bare `.tmpXXXXXX` may be any safetensors writer's (ComfyUI's own LoRA saves): not ours to delete.
        users = ["notes.tmp", ".notes.tmp", "mine.safetensors.tmp", ".mine.safetensors.tmp", ".mine.12.tmp.bak",
                 f".mine.png.{dead_pid()}.tmp", ".tmpAbC123"]
        for name in users:
            (loras / name).write_text("the user's")
            os.utime(loras / name, (time.time() - 7200,) * 2)
        theirs.write_text("being written")
        trained_lora.save_lora(loras / "mine.safetensors")
        assert not leftover.exists()
        assert theirs.exists() and all((loras / name).read_text() == "the user's" for name in users)
        assert load_file(str(loras / "mine.safetensors"))
        assert listing(loras) == sorted(users + ["mine.safetensors", theirs.name])
    finally:
        live.kill()
        live.wait()


def test_leftovers_in_a_cache_go_when_it_is_next_built(demo_folder, tmp_path):
    components = build_tiny_components(seed=0, storage="float32")
    cache = tmp_path / "cache"
    first = cached_demo(components, demo_folder, cache)
    key = first.samples[0].latent_key
    (cache / "latents" / f"{key}.safetensors").unlink()
    leftover = kill_mid_write(cache / "latents" / f"{key}.safetensors")
    users = [".notes.safetensors.12.tmp", "notes.tmp", f".{key}.safetensors.tmp", ".tmpAbC1234", "tmpAbC123"]
    for name in users:
        (cache / "latents" / name).write_text("the user's")
    # safetensors' own temporary file, as an earlier version's killed write left it (an hour old), and one of a
    # run in another process writing now (fresh): only the old one goes.
    stale, fresh = cache / "latents" / ".tmpAbC123", cache / "latents" / ".tmpXyZ789"
    stale.write_bytes(b"\0" * 100)
    os.utime(stale, (time.time() - 3600,) * 2)
    fresh.write_bytes(b"\0" * 100)
    report = cached_demo(build_tiny_components(seed=0, storage="float32"), demo_folder, cache).report
    assert report.latents_encoded == 1
    assert not leftover.exists() and not stale.exists() and fresh.exists()
    assert all((cache / "latents" / name).read_text() == "the user's" for name in users)


def test_leftovers_in_a_run_folder_go_when_it_is_next_opened(tiny_cache, demo_folder, tmp_path):
    run = tmp_path / "run"
    t = make_trainer(tiny_cache, demo_folder, run_dir=run)
    t.train(2)
    t.close()
    root = ckpt.checkpoints_dir(run)
    pid = dead_pid()
    # What a writer killed at each point leaves, with exactly the writers' names.
    half = root / f".step_000003.tmp-{pid}"  # killed while writing step 3's folder
    half.mkdir()
    (half / ckpt.STATE_TENSORS).write_bytes(b"half a file")
    pointer = root / f".{ckpt.LATEST}.{pid}.tmp"  # killed while replacing latest.json
    pointer.write_text('{"dir": "step_0')
    going = root / f".step_000001.old-{pid}"  # killed while pruning step 1 (renamed aside, not yet deleted)
    shutil.copytree(root / "step_000002", going)
    users = {root / "notes.tmp": "file", root / ".step_000003.tmp": "dir", root / f"step_000004.tmp-{pid}": "dir",
             root / ".latest.json.tmp": "file", run / f".state.safetensors.{pid}.tmp": "file",
             root / f".step_x.tmp-{pid}": "dir"}
    for path, kind in users.items():
        path.mkdir() if kind == "dir" else path.write_text("the user's")
    t = make_trainer(tiny_cache, demo_folder, run_dir=run)
    assert not half.exists() and not pointer.exists() and not going.exists()
    assert all(p.exists() for p in users)
    assert t.resume() and t.step == 2
    t.close()


def test_a_resave_killed_between_its_renames_is_put_back(tiny_cache, demo_folder, tmp_path):
    """Saving a step again sets the earlier folder aside first; killed before the new one is in place, the
    earlier one comes back at the next start instead of being lost."""
    run = tmp_path / "run"
    t = make_trainer(tiny_cache, demo_folder, run_dir=run)
    t.train(2)
    t.close()
    root = ckpt.checkpoints_dir(run)
    before = (root / "step_000002" / ckpt.STATE_TENSORS).read_bytes()
    os.replace(root / "step_000002", root / f".step_000002.old-{dead_pid()}")
    t = make_trainer(tiny_cache, demo_folder, run_dir=run)
    assert (root / "step_000002" / ckpt.STATE_TENSORS).read_bytes() == before
    assert t.resume() and t.step == 2
    t.close()


# -- cache determinism ----------------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_a_cache_built_across_a_kill_equals_one_built_in_one_go(demo_folder, tmp_path, batch_size):
    """As if the first run were killed after 3 images: its entries stay, the next run encodes the rest. Every
    entry equals, bit for bit, the one a single uninterrupted run writes. (Before each image was encoded
    alone, a latent depended on its batch companions, ~2e-7: 2 and 4 failed here, 1 passed.)"""
    from trainer_core.data.cache import build_cache
    from trainer_core.data.images import discover
    from conftest import tiny_dataset_config

    samples = discover(tiny_dataset_config(demo_folder))
    whole = tmp_path / "whole"
    halves = tmp_path / "halves"
    build_cache(build_tiny_components(seed=0, storage="float32"), samples, whole, batch_size=batch_size)
    build_cache(build_tiny_components(seed=0, storage="float32"), samples[:3], halves, batch_size=batch_size)
    build_cache(build_tiny_components(seed=0, storage="float32"), samples, halves, batch_size=batch_size)
    names = sorted(p.relative_to(whole) for p in whole.rglob("*.safetensors"))
    assert names == sorted(p.relative_to(halves) for p in halves.rglob("*.safetensors"))
    assert len(names) == 8 + 9
    different = [str(n) for n in names if not same_entry(whole / n, halves / n)]
    assert not different


def same_entry(a: Path, b: Path) -> bool:
    """Bit-equal tensors and equal metadata (the file bytes may differ: safetensors writes its metadata map in
    no fixed key order)."""
    with safe_open(str(a), "pt") as fa, safe_open(str(b), "pt") as fb:
        if fa.metadata() != fb.metadata() or sorted(fa.keys()) != sorted(fb.keys()):
            return False
        return all(torch.equal(fa.get_tensor(k), fb.get_tensor(k)) and fa.get_tensor(k).dtype == fb.get_tensor(k).dtype
                   for k in fa.keys())


def test_every_write_message_is_in_the_troubleshooting_page():
    section = (REPO / "docs" / "troubleshooting.md").read_text()
    for message in ("the disk is full: the cache entry", "the disk quota is used up", "the file is too large",
                    "no permission to write", "the disk is read-only", "a file is in the way", ".step_N.tmp-PID",
                    "bit for bit", "the cache folder was changed or deleted"):
        assert message in section, message


def test_cache_deleted_while_training(demo_folder, tmp_path):
    t = make_trainer(tmp_path / "cache", demo_folder)
    shutil.rmtree(tmp_path / "cache")
    with pytest.raises(UserInputError, match=r"^the cache entry .*cache/(latents|text)/[0-9a-f]{32}\.safetensors cannot "
                                             r"be read \(missing\): the cache folder was changed or "
                                             r"deleted .*Run the Cache node again"):
        t.train(8)
    t.close()


def test_export_tiny_to_a_full_disk(disk, capsys):
    from trainer_core.runs.cli import main

    d = disk("256k")
    d.fill()
    assert main(["export-tiny", str(d.path / "tiny")]) == 2
    assert "error: the disk is full: the tiny model files could not be written to" in capsys.readouterr().err
