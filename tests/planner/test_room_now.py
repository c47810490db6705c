"""`planner.device.room_now`, the one rule behind every memory decision taken while the pack runs, fed the readings of
the first device check (H100 80 GB, 6 December, `benchmarks/device_results/h100_2026-12-06.md`): 79.2 GiB card, 0.51
GiB CUDA context, each budgeted setting held to its card by `set_per_process_memory_fraction`."""

import pytest

from trainer_core.planner import GIB
from trainer_core.planner.device import (DECISION_RESERVE_BYTES, DeviceMemory, detect_budget, fits_now, room_now,
                                         whole_decode_bytes)
from trainer_core.planner.inference import real_parts

CARD = int(79.2 * GIB)
CONTEXT = int(526.8 * (1 << 20))


def h100_before_preview(card_gib: float | None, allocated_gib: float, reserved_gib: float) -> DeviceMemory:
    """The H100 as the preview found it: the training state allocated, torch's pool at the train phase's size, the rest
    of the card free; capped to a `card_gib` card (its context outside the cap) unless None."""
    reserved = int(reserved_gib * GIB)
    cap = None if card_gib is None else int(card_gib * GIB) - CONTEXT
    return DeviceMemory(free=CARD - CONTEXT - reserved, total=CARD, reserved=reserved,
                        allocated=int(allocated_gib * GIB), cap=cap)


# (setting, card, allocated before the preview (its init/save rows), reserved (its train row less the context), tiles)
H100 = [("auto for 16 GiB (27 swapped)", 16, 12.485, 15.4, True),
        ("auto for 24 GiB (3 swapped)", 24, 20.127, 23.0, True),
        ("all resident, uncapped", None, 20.443, 23.6, False)]


@pytest.mark.parametrize("setting, card, allocated, reserved, tiles", H100)
def test_the_h100_previews_decode_in_tiles_where_the_card_needs_it(setting, card, allocated, reserved, tiles):
    """The whole 1024^2 decode and the VAE, against the room the capped card has beside the training state: at 16 and
    24 GiB it tiles (the old rule, free + reserved within the cap, saw ~15 and ~23 GiB and decoded whole, peaking past
    the cap); on the uncapped 80 GB card it decodes whole."""
    parts = real_parts()
    need = whole_decode_bytes(parts, 1024, 1024, 2) + parts.vae_params * 2
    assert 3 * GIB < need < 6 * GIB  # the whole decode's size: larger than either capped card's room
    memory = h100_before_preview(card, allocated, reserved)
    assert fits_now(need, memory) is not tiles
    if card is not None:
        old_rule = min(memory.free + memory.reserved, memory.cap) - DECISION_RESERVE_BYTES
        assert old_rule > need  # what decoded whole and ran out of memory under the cap
        assert room_now(memory) == memory.cap - memory.allocated - DECISION_RESERVE_BYTES


def test_room_is_what_one_more_allocation_can_get():
    """Uncapped: free plus torch's cached-but-unused blocks; capped: the cap less what is allocated, whichever is less;
    tensors the caller's plan counts itself are given back once."""
    m = DeviceMemory(free=10 * GIB, total=80 * GIB, reserved=6 * GIB, allocated=4 * GIB)
    assert room_now(m, reserve_bytes=0) == 12 * GIB
    capped = DeviceMemory(free=10 * GIB, total=80 * GIB, reserved=6 * GIB, allocated=4 * GIB, cap=8 * GIB)
    assert room_now(capped, reserve_bytes=0) == 4 * GIB
    assert room_now(capped, counted_bytes=3 * GIB, reserve_bytes=0) == 7 * GIB  # e.g. a resident captioner's weights
    budget = detect_budget(memory=capped, counted_bytes=3 * GIB)
    assert budget.bytes == 7 * GIB - DECISION_RESERVE_BYTES and "held to 8.0 GiB" in budget.source


def test_the_caption_batch_follows_the_room_not_the_reserved_pool():
    """The captioner's batch (`captioning.caption_batch_that_fits`) against the room: a pool reserved by a finished
    run's tensors that are still alive is not room; the same pool with its tensors freed is."""
    from trainer_core.planner.captioning import caption_batch_that_fits, weights_bytes
    from trainer_core.planner.plan import PlanInputs
    from trainer_core.families.registry import get_family

    parts = get_family("qwen-image").planned_caption_parts()
    plan = PlanInputs(caption=True, device="cuda", caption_storage="bfloat16", cuda_context_bytes=0,
                      caption_image=(1024, 1024))
    resident = weights_bytes(parts, "bfloat16", 2)
    held = DeviceMemory(free=2 * GIB, total=80 * GIB, reserved=resident + 30 * GIB, allocated=resident + 30 * GIB)
    freed = DeviceMemory(free=2 * GIB, total=80 * GIB, reserved=resident + 30 * GIB, allocated=resident)
    few = caption_batch_that_fits(plan, parts, room_now(held, counted_bytes=resident))
    many = caption_batch_that_fits(plan, parts, room_now(freed, counted_bytes=resident))
    assert few < many
