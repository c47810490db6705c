"""A step's recorded events, in issue order: what `planner.timeline` predicts, event for event.

    ("copy", block, bytes)     the swapper issued a host-to-device copy of part of block's blob
    ("wait", block)            the compute stream waits for block's weights (a streamed block, every pass)
    ("compute", block, pass_)  block runs in pass_ (placement.FORWARD or BACKWARD: recompute + backward)

A list, so a recorded step compares equal to the timeline's list of tuples.
"""

from __future__ import annotations


class Trace(list):
    def copy(self, block: int, nbytes: int) -> None:
        self.append(("copy", block, nbytes))

    def wait(self, block: int) -> None:
        self.append(("wait", block))

    def compute(self, block: int, pass_: str) -> None:
        self.append(("compute", block, pass_))
