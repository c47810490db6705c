"""Which blocks are streamed, how deep the ring of GPU slots is, and when each copy is issued: pure policy.

`swapper.BlockSwapper` executes this policy with real tensors; `planner.timeline` runs the same policy on
paper to predict a step's copies, waits and computes (and their times). One policy, two users: the test
that records a real step's events and compares them with the timeline's schedule checks that autograd
really visits the blocks in the order the model assumes and that the bytes moved are the ones planned.

No torch here: plain integers, so the planner can import it without the engine.

A pass visits every block once: forward ascending, backward (recompute + backward under checkpointing)
descending. A streamed block's frozen Linear weights are one contiguous blob in host memory, laid out as
[backward part | forward-only tail]: the tail holds the modulation Linears, which only the forward needs
(`models.qwen_arch.MODULATION_LINEARS`). So a copy is always one contiguous range: the backward part, the
whole blob, or the tail alone (when a slot already holds the block's backward part).

Modulation ahead (training under checkpointing, `runner.BlockRunner.plan_modulation`): a block's modulation
outputs depend on the timestep alone, so the forward that has a streamed block's whole blob on the GPU (the
first of a window of up to MODULATION_WINDOW training forwards) computes them for the whole window, and every
other training forward of the window copies the backward part alone, like the backward. The runner tells the
ring which kind of forward runs now and which comes next (a preview's or a validation's forward needs whole
blocks too).

Ring: streamed block number j (in depth order) always goes to slot j % ring. A copy into a slot may be
issued once the slot's owner has run in the current pass (its kernels are queued; the copy stream waits
for the compute stream before it writes). At each block the policy issues every such copy for the blocks
that come next in the pass, in order, stopping at the first whose slot is still busy: copies run as far
ahead as the ring allows, in both passes.
"""

from __future__ import annotations

from dataclasses import dataclass

FORWARD, BACKWARD = "forward", "backward"
# What of a block's weights a slot holds: its whole blob, or the backward part only.
WHOLE, BACKWARD_PART = "whole", "backward part"
MIN_RING = 2  # one slot computes while the next one fills
NUM_SLOTS = MIN_RING  # the default ring depth (the planner's and the swapper's)
# Training forwards per modulation window: the first copies whole blocks and computes the modulation outputs of
# all of them; the others copy backward parts only. Longer windows copy fewer modulation weights (113 MB per
# real block per window) and keep more outputs on the GPU (74 KB per streamed block, forward and sample).
MODULATION_WINDOW = 16
BLOB_ALIGN = 512  # bytes; every weight in a blob starts at a multiple (any dtype, fast DMA)


def align_up(n: int, to: int = BLOB_ALIGN) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class BlobLayout:
    """One block's frozen weights in one byte blob: offsets of the tensors (in the order given), and the
    byte lengths of the backward part and the whole (the forward-only tensors come last)."""

    offsets: tuple[int, ...]
    backward_bytes: int
    whole_bytes: int

    @property
    def tail_bytes(self) -> int:
        return self.whole_bytes - self.backward_bytes


def blob_layout(sizes: list[int], forward_only: list[bool]) -> BlobLayout:
    """Offsets for tensors of `sizes` bytes; those flagged `forward_only` go after all the others."""
    order = [i for i, f in enumerate(forward_only) if not f] + [i for i, f in enumerate(forward_only) if f]
    offsets = [0] * len(sizes)
    end = backward = 0
    for i in order:
        offsets[i] = end
        end += align_up(sizes[i])
        if not forward_only[i]:
            backward = end
    return BlobLayout(tuple(offsets), backward, end)


@dataclass(frozen=True)
class Placement:
    """The streamed blocks (ascending) and the ring depth (GPU slots of one block's weights each)."""

    streamed: tuple[int, ...]
    ring: int

    def __post_init__(self):
        if list(self.streamed) != sorted(set(self.streamed)):
            raise ValueError(f"streamed blocks must be distinct and ascending: {self.streamed}")
        if self.streamed and not 1 <= self.ring <= len(self.streamed):
            raise ValueError(f"ring depth {self.ring} for {len(self.streamed)} streamed blocks")

    @property
    def slots(self) -> int:
        return self.ring if self.streamed else 0

    def slot(self, block: int) -> int:
        return self.streamed.index(block) % self.ring


def ring_for(k: int, ring: int = MIN_RING) -> int:
    """The ring depth for k streamed blocks: never more slots than streamed blocks (a slot per streamed block
    already keeps them all on the GPU)."""
    return min(max(ring, 1), k)


def tail_placement(num_blocks: int, k: int, ring: int = MIN_RING) -> Placement:
    """The last k blocks (the layout before the timeline model: each copy overlaps one block's compute)."""
    return Placement(tuple(range(num_blocks - k, num_blocks)), ring_for(k, ring))


def spread_placement(num_blocks: int, k: int, ring: int = MIN_RING) -> Placement:
    """k streamed blocks spread evenly over the depth: block floor((j + 1/2) n / k) for j < k, so the resident
    blocks sit between them and their compute hides the copies. Distinct because n / k >= 1."""
    return Placement(tuple(int((j + 0.5) * num_blocks / k) for j in range(k)), ring_for(k, ring))


def default_placement(num_blocks: int, k: int, ring: int = MIN_RING) -> Placement:
    return spread_placement(num_blocks, k, ring)


@dataclass(frozen=True)
class Load:
    """One copy: `block` into `slot`, from holding `have` of it (None: nothing) to holding `part`."""

    block: int
    slot: int
    have: str | None
    part: str

    def byte_range(self, blob: BlobLayout) -> tuple[int, int]:
        """The contiguous bytes of the blob this copy moves."""
        if self.have == BACKWARD_PART:  # only the forward-only tail is missing
            return blob.backward_bytes, blob.whole_bytes
        return 0, blob.whole_bytes if self.part == WHOLE else blob.backward_bytes


class Ring:
    """The slots' contents and the copy policy (module docstring). Holds no tensors."""

    def __init__(self, placement: Placement):
        self.placement = placement
        self.owner: list[int | None] = [None] * placement.slots
        self.part: list[str | None] = [None] * placement.slots
        self.position = {b: j for j, b in enumerate(placement.streamed)}
        # Modulation ahead (module docstring): whether the forward running now, and the forward after the
        # backward running now, compute the modulation Linears. True unless the block runner says otherwise.
        self.forward_needs_modulation = True
        self.next_forward_needs_modulation = True

    def need(self, pass_: str, block: int) -> str:
        """What a pass needs of a block. A forward needs the whole blob unless its modulation outputs were
        computed ahead. Backward needs no modulation weights, except that the blocks that stay in the ring for
        the next forward (the first `ring` streamed ones) are loaded whole there when that forward will need
        them, so it starts with no copy and the tails move while the backward has time to spare."""
        if pass_ == FORWARD:
            return WHOLE if self.forward_needs_modulation else BACKWARD_PART
        if self.next_forward_needs_modulation and self.position[block] < self.placement.ring:
            return WHOLE
        return BACKWARD_PART

    def holds(self, block: int, part: str) -> bool:
        slot = self.placement.slot(block)
        return self.owner[slot] == block and (self.part[slot] == WHOLE or part == BACKWARD_PART)

    def _take(self, block: int, part: str) -> Load:
        """The copy that makes `block`'s slot hold `part` of it; the ring counts it as done from now on."""
        slot = self.placement.slot(block)
        load = Load(block, slot, self.part[slot] if self.owner[slot] == block else None, part)
        self.owner[slot], self.part[slot] = block, part
        return load

    def loads_at(self, pass_: str, block: int) -> tuple[Load | None, list[Load]]:
        """(the copy block `block` itself still needs or None, the copies to issue ahead, in order), right
        before `block` runs in `pass_`. The ring's state includes them when this returns."""
        ensure = None
        if block in self.position and not self.holds(block, self.need(pass_, block)):
            ensure = self._take(block, self.need(pass_, block))
        streamed = self.placement.streamed
        if pass_ == FORWARD:
            ahead, done = [j for j in streamed if j > block], (lambda b: b < block)
        else:
            ahead, done = [j for j in reversed(streamed) if j < block], (lambda b: b > block)
        prefetch = []
        for j in ahead:
            need = self.need(pass_, j)
            if self.holds(j, need):
                continue
            owner = self.owner[self.placement.slot(j)]
            if owner is not None and owner != j and not done(owner):
                break  # its slot still serves a block of this pass that has not run: copies stay in order
            prefetch.append(self._take(j, need))
        return ensure, prefetch
