"""Checkpointing only as deep as memory needs (`search.auto_checkpointed_blocks`): the fewest recomputing blocks
whose planned peak fits, at the swap count the swap search chose; and the plan of a partial depth lies between
every block recomputing and none."""

import dataclasses

from trainer_core.planner import GIB, PlanInputs, auto_blocks_to_swap
from trainer_core.planner.arch import real_arch
from trainer_core.planner.phases import gpu_peak_after_caching
from trainer_core.planner.plan import plan_memory
from trainer_core.planner.search import auto_checkpointed_blocks

INPUTS = PlanInputs(width=1024, height=1024, rank=32)


def _peak(inputs, budget, **change):
    arch = real_arch()
    return gpu_peak_after_caching(plan_memory(dataclasses.replace(inputs, **change), arch), arch, None, budget)


def _chosen(gib: int) -> tuple[int, int, PlanInputs]:
    k = auto_blocks_to_swap(INPUTS, gib * GIB).blocks_to_swap
    inputs = dataclasses.replace(INPUTS, blocks_to_swap=k)
    return k, auto_checkpointed_blocks(inputs, gib * GIB), inputs


def test_an_80_gb_card_recomputes_no_block_and_a_24_gib_card_every_block():
    assert _chosen(80)[:2] == (0, 0)
    swapped, recomputed, _ = _chosen(24)
    assert swapped > 0 and recomputed == real_arch().num_blocks  # streamed blocks: every block recomputes


def test_between_them_the_depth_is_the_fewest_that_fits():
    n = real_arch().num_blocks
    depths = []
    for gib in (48, 40, 32):
        swapped, k, inputs = _chosen(gib)
        assert swapped == 0 and 0 < k < n
        assert _peak(inputs, gib * GIB, checkpointed_blocks=k) <= gib * GIB
        assert _peak(inputs, gib * GIB, checkpointed_blocks=k - 1) > gib * GIB
        assert _peak(inputs, gib * GIB, checkpointed_blocks=0) > gib * GIB
        depths.append(k)
    assert depths == sorted(depths) and len(set(depths)) == 3  # less memory, deeper recompute


def test_a_partial_depth_plans_between_all_and_none_and_none_means_all():
    arch = real_arch()
    total = lambda **c: plan_memory(dataclasses.replace(INPUTS, **c), arch).gpu_total  # noqa: E731
    assert total(checkpointed_blocks=None) == total(checkpointed_blocks=arch.num_blocks)
    assert total(checkpointed_blocks=0) == total(checkpointing=False)
    assert total() < total(checkpointed_blocks=40) < total(checkpointed_blocks=20) < total(checkpointed_blocks=0)
    assert auto_checkpointed_blocks(dataclasses.replace(INPUTS, checkpointing=False), 80 * GIB) == 0
