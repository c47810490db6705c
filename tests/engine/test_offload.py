"""The swapper's pinned-memory arena: power-of-two chunks, no overlap, little slack, exact copies."""

import torch

from trainer_core.streaming.arena import ARENA_ALIGN, MIB, PinnedArena, arena_layout


def test_layout_uses_power_of_two_chunks_without_overlap():
    sizes = [54 * MIB, 54 * MIB] + [9 * MIB] * 8 + [36 * MIB] * 4  # one real block's float8 Linears
    caps, places = arena_layout(sizes * 29)  # 29 swapped blocks
    assert all(c & (c - 1) == 0 for c in caps)  # what torch's pinned allocator would round to anyway
    spans = sorted((c, off, off + size) for (c, off), size in zip(places, sizes * 29))
    for (c1, _, end1), (c2, start2, _) in zip(spans, spans[1:]):
        assert c1 != c2 or end1 <= start2
    assert all(end <= caps[c] for c, _, end in spans)
    assert all(off % ARENA_ALIGN == 0 for _, off in places)
    used = sum(sizes) * 29
    assert sum(caps) - used < 0.12 * used  # pinning each weight alone would waste ~45% here


def test_arena_holds_exact_copies_with_shapes_and_dtypes():
    tensors = [torch.randn(33, 7), torch.randn(5, 3).to(torch.float8_e4m3fn), torch.randn(2, 9).bfloat16()]
    arena = PinnedArena([(t.shape, t.dtype) for t in tensors], pin=False)
    for n, t in enumerate(tensors):
        arena.store(n, t)
    for original, view in zip(tensors, arena.views):
        assert view.dtype == original.dtype and view.shape == original.shape
        assert torch.equal(view.view(torch.uint8), original.view(torch.uint8))
    assert arena.bytes == sum(arena_layout([t.numel() * t.element_size() for t in tensors])[0])


def test_unpin_moves_the_masters_out_of_the_arena_and_frees_it():
    """Releasing a run moves the swapped masters out of the (pinned on CUDA) arena and
    the arena's memory goes back; the weights are unchanged."""
    import weakref

    from trainer_core.families.qwen_image import build_tiny_components
    from trainer_core.streaming.runner import BlockRunner

    components = build_tiny_components(seed=0, storage="float32")
    blocks = components.transformer.transformer_blocks
    before = {n: t.clone() for n, t in blocks[1].state_dict().items()}
    runner = BlockRunner(components.transformer, torch.device("cpu"), blocks_to_swap=1)
    swapper = runner.swapper
    chunks = [weakref.ref(c) for c in swapper.arena.chunks]
    runner.uninstall(unpin=True)
    del swapper, runner
    assert chunks and all(c() is None for c in chunks)
    assert all(torch.equal(before[n], t) for n, t in blocks[1].state_dict().items())


def test_arena_allocates_a_chunk_when_its_first_tensor_arrives():
    """Filling the arena while freeing each original holds at most one chunk beyond the masters."""
    specs = [(torch.Size([64, 64]), torch.float32)] * 3
    arena = PinnedArena(specs, pin=False)
    assert arena.bytes == 0 and arena.views == [None] * 3  # nothing held before the first tensor arrives
    arena.store(0, torch.ones(64, 64))
    assert arena.bytes == arena.caps[0]
    for n in (1, 2):
        arena.store(n, torch.full((64, 64), float(n)))
    assert [float(v[0, 0]) for v in arena.views] == [1.0, 1.0, 2.0]


def test_pinning_refused_falls_back_to_ordinary_memory_and_says_so():
    """Where page-locked memory is refused (here: a CPU-only torch, which cannot pin; on Windows or under a
    cap, the driver), the arena keeps going in ordinary memory and records why."""
    if torch.cuda.is_available():
        import pytest
        pytest.skip("this machine can pin memory")
    arena = PinnedArena([(torch.Size([4, 4]), torch.float32)], pin=True)
    view = arena.store(0, torch.arange(16.0).view(4, 4))
    assert torch.equal(view, torch.arange(16.0).view(4, 4))
    assert arena.pinned == [False] and not arena.all_pinned and arena.pin_error


def test_no_pinned_chunk_is_larger_than_three_blocks_need():
    """The chunk being filled is held twice for a while (page-locked whole, its blobs still in ordinary memory): the
    first device check measured 7.8 GiB more host RAM at init with 8 GiB chunks. Chunks now hold at most three blobs:
    1 GiB for Qwen-Image's float8 blocks (324 MiB), 2 GiB for its bf16 ones, within 5% unused room either way."""
    from trainer_core.streaming.arena import blob_chunks

    for blob, largest in ((324 * MIB, 1 << 30), (648 * MIB, 2 << 30)):
        for count in (3, 27, 59):
            chunks = blob_chunks(blob, count)
            assert max(chunks) == largest
            assert sum(chunks) - count * blob <= 0.06 * count * blob + 512 * MIB
