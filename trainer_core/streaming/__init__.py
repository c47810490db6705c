"""Running the transformer's blocks in training: checkpointing, and streaming frozen weights through a ring.

    runner.py              BlockRunner: installs itself on the blocks and walks both passes (the entry point)
    forwards.py            the per-instance forwards it installs and removes; finding a runner left installed
    checkpointing.py       one block under activation checkpointing; the mark that starts its backward
    modulation_outputs.py  modulation outputs kept for the recompute, and computed ahead for planned forwards
    swapper.py             BlockSwapper: host master copy -> GPU slots, host-to-device only, on a side stream
    arena.py               the (pinned) host chunks the masters live in, and their layout arithmetic
    shared_host.py         one host copy per machine of the frozen host weights, for several processes
    shared_segment.py      the bytes the processes of a machine map together (memfd / named mapping / file)
    placement.py           pure policy: which blocks stream, the ring, each copy's bytes and moment (no torch)
    trace.py               a step's recorded copies, waits and computes (what planner.timeline predicts)

Imports point down: runner -> the others -> placement; all may use models/, none the trainer. This file
imports nothing, so the planner can read the pure placement policy without loading the engine's parts.
"""
