"""The swapper's pinned-memory arena: power-of-two chunks, no overlap, little slack, exact copies."""

import torch

from trainer_core.offload import ARENA_ALIGN, MIB, PinnedArena, arena_layout


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
    arena = PinnedArena(tensors, pin=False)
    for original, view in zip(tensors, arena.views):
        assert view.dtype == original.dtype and view.shape == original.shape
        assert torch.equal(view.view(torch.uint8), original.view(torch.uint8))
    assert arena.bytes == sum(arena_layout([t.numel() * t.element_size() for t in tensors])[0])


def test_unpin_moves_the_masters_out_of_the_arena_and_frees_it():
    """Releasing a run moves the swapped masters out of the (pinned on CUDA) arena and
    the arena's memory goes back; the weights are unchanged."""
    import weakref

    from trainer_core.models import build_tiny_components
    from trainer_core.offload import BlockRunner

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
