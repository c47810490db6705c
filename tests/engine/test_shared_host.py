"""The machine's shared host copy of the frozen weights (streaming/shared_host.py, shared_segment.py), in one process and
one child: every parameter points into one segment with the swapper's blob layout, another process maps the same bytes
read-only, a process that writes into them dies without changing them, and the pages go with the last mapping.
(torchrun runs of two processes sharing one copy: test_distributed.py, test_distributed_kill.py.)"""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO
from trainer_core.streaming.shared_host import SharedHostCopy, host_layout
from trainer_core.streaming.shared_segment import SEGMENT_NAME

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memory files and /proc: Linux")


def tiny_transformer(seed: int):
    from trainer_core.families.qwen_image import build_tiny_components

    return build_tiny_components(seed=seed, storage="float32", compute_dtype=torch.float32,
                                 device=torch.device("cpu")).transformer


def mapped_segments() -> int:
    return Path("/proc/self/maps").read_text().count(f"memfd:{SEGMENT_NAME}")


@linux_only
def test_two_models_point_at_one_read_only_copy_that_a_writing_process_cannot_change():
    from trainer_core.streaming.runner import BlockRunner
    from trainer_core.streaming.placement import default_placement

    first, second = tiny_transformer(0), tiny_transformer(1)  # other weights: attaching must replace them all
    reference = {n: p.detach().clone() for n, p in first.named_parameters()}
    streamed = (1,)
    layout = host_layout(first, streamed)
    assert layout.nbytes >= sum(p.numel() * p.element_size() for p in first.parameters())
    writer = SharedHostCopy.create(layout)
    writer.fill(first)
    reader = SharedHostCopy.attach(layout, writer.handle)
    reader.adopt(second)
    for model in (first, second):
        for name, p in model.named_parameters():
            assert torch.equal(p, reference[name])
            start = p.data_ptr() - reader.segment.tensor.data_ptr() if model is second else \
                p.data_ptr() - writer.segment.tensor.data_ptr()
            assert 0 <= start < layout.nbytes  # in the segment
    assert not writer.segment.writable and not reader.segment.writable  # both mapped read-only

    # The swapper copies the streamed block from its blob in the shared copy: no arena of its own.
    runner = BlockRunner(second, torch.device("cpu"), placement=default_placement(len(second.transformer_blocks), 1),
                         host_copy=reader)
    assert runner.swapper.arena is None and "one host copy" in runner.swapper.pinned_status
    assert runner.swapper.regions[1].data_ptr() == reader.blob(1).data_ptr()
    runner.uninstall(unpin=True)
    assert all(torch.equal(p, reference[n]) for n, p in second.named_parameters())

    # A process that writes into its read-only mapping is stopped by the kernel; the bytes stay as they were.
    child = ("import sys, torch; from trainer_core.streaming.shared_segment import SharedSegment; "
             f"s = SharedSegment.attach({writer.handle!r}, {layout.nbytes}); assert s.tensor[:4].tolist() is not None; "
             "s.tensor.add_(1)")
    result = subprocess.run([sys.executable, "-c", child], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == -signal.SIGSEGV, result.stderr[-2000:]
    assert all(torch.equal(p, reference[n]) for n, p in first.named_parameters())
    writer.seal()
    with pytest.raises(RuntimeError, match="no longer the host copy"):  # attached after every process had
        SharedHostCopy.attach(layout, writer.handle)

    # The pages go with the last mapping (no name anywhere once sealed).
    assert mapped_segments() >= 1
    del first, second, runner, writer, reader, model, p  # (the loop above left `model` and `p` bound)
    gc.collect()
    assert mapped_segments() == 0


@linux_only
def test_a_process_that_attaches_reads_no_weight_of_the_shared_part_from_the_file(tiny_files):
    """The protocol of training/host_copy.py in one process, with a key-value store standing in for the process
    group's: the machine's first process reads the file and posts its copy; a later process waits for the post, maps
    the copy and loads its transformer with the copy's tensors standing in for the file's, reading from the file
    exactly the tensors the copy does not hold (nothing, where the whole frozen model is in host memory, as on a CPU
    device). float8_scaled storage: the scales made while quantising come from the copy too."""
    import torch.distributed as dist

    from trainer_core.models.safetensors_file import TENSOR_BYTES_READ
    from trainer_core.models.transformer_file import TransformerFile
    from trainer_core.training.distributed import Replicas
    from trainer_core.training.host_copy import attach_before_load, share_host_copy

    cpu, streamed = torch.device("cpu"), (1,)
    path = tiny_files["transformer_bf16"]
    source = TransformerFile(path, storage="float8_scaled", compute_dtype=torch.float32)
    key = str(Path(path).resolve())
    data_bytes = {n: end - first for n, k in source.names.items() for first, end in [source.file.byte_range(k)]}

    first_replicas = Replicas(rank=0, size=2, local_rank=0, local_size=2)
    second_replicas = Replicas(rank=1, size=2, local_rank=1, local_size=2)
    store = dist.HashStore()
    read = TENSOR_BYTES_READ[key]
    first = source.load(cpu, set(streamed))
    assert TENSOR_BYTES_READ[key] - read == sum(data_bytes.values())  # the first process reads every tensor
    reference = {**{n: p.detach().clone() for n, p in first.named_parameters()},
                 **{n: b.clone() for n, b in first.named_buffers() if n.endswith("weight_scale")}}
    assert any(n.endswith("weight_scale") for n in reference)
    copy = share_host_copy(first, streamed, first_replicas, cpu, store=store)
    assert copy is not None and {e.name for e in copy.layout.entries} == set(reference)  # all of it, scales too

    posted = attach_before_load(second_replicas, store)
    read = TENSOR_BYTES_READ[key]
    second = source.load(cpu, set(streamed), given=posted.given)
    assert TENSOR_BYTES_READ[key] - read == 0  # not one byte of a weight read from the file
    attached = share_host_copy(second, streamed, second_replicas, cpu, posted, store=store)
    start = attached.segment.tensor.data_ptr()
    for name, tensor in [*second.named_parameters(), *second.named_buffers()]:
        if name in reference:
            assert torch.equal(tensor, reference[name]), name
            assert 0 <= tensor.data_ptr() - start < attached.nbytes, name  # in the mapped copy: no copy of its own

    # Where part of the model is elsewhere (a GPU's resident blocks), only that part is read: here the copy stands
    # in for the streamed block alone.
    only_block = {n: t for n, t in posted.given.items() if n.startswith("transformer_blocks.1.")}
    read = TENSOR_BYTES_READ[key]
    source.load(cpu, set(streamed), given=only_block)
    assert TENSOR_BYTES_READ[key] - read == sum(b for n, b in data_bytes.items() if n not in only_block)
    assert only_block and all(n in data_bytes for n in only_block)
