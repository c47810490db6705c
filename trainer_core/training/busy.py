"""One trainer works in one place at a time.

A trainer's adapter, optimizer, data order, RNG state and block runner (streamed slots, planned modulation)
are one piece of state that a training step changes throughout. Two callers on one trainer at once (two
threads, an API client beside the canvas, a script beside a node) would interleave steps, plan modulation
for one another's draws, or sample and save a LoRA in the middle of an optimizer step: raw errors, or a
silently wrong run. So every entry point that uses that state holds the trainer's `Busy` for its length, and
a second caller from another thread is refused at once with what is running and what to do, before it
touches anything: the first caller goes on undisturbed.

Refused rather than queued: a caller that waits could wait for a training of hours with nothing shown, and
a host (ComfyUI) runs its own queue one prompt after another anyway; what reaches here at once is a second
client, which should be told. Within the one thread that holds it, nested use is allowed (Train Steps
samples its own previews and saves its own snapshots), except a second training inside a training.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from contextlib import contextmanager

from ..core.errors import UserInputError


class Busy:
    def __init__(self, describe_run):
        # describe_run() -> "run 'name' (at step N)": read when a caller is refused, so it says where it stands.
        self._describe_run = describe_run
        self._guard = threading.Lock()
        self._thread: int | None = None  # the thread that holds it
        self._what: list[str] = []  # what it is doing, outermost first

    @property
    def doing(self) -> str | None:
        """What holds the trainer now (outermost), or None."""
        return self._what[0] if self._what else None

    @contextmanager
    def hold(self, what: str, nests: bool = True):
        """Hold the trainer for `what` (a node's or method's name, shown to a refused caller). `nests`: may
        run inside the same thread's other work (False for training itself)."""
        me = threading.get_ident()
        with self._guard:
            if self._what and (self._thread != me or not nests):
                raise UserInputError(self._refusal(what, same_thread=self._thread == me))
            self._thread = me
            self._what.append(what)
        try:
            yield
        finally:
            with self._guard:
                self._what.pop()
                if not self._what:
                    self._thread = None

    def _refusal(self, what: str, same_thread: bool) -> str:
        where = "inside it (from its own callback)" if same_thread else "from another place at the same time"
        return (f"{what} was refused: {self._describe_run()} is busy with {self._what[0]}, and {what} was asked "
                f"{where}. One trainer runs one thing at a time, and {self._what[0]} goes on undisturbed. Wait until "
                f"it has finished (or interrupt it) and run {what} again; to train two LoRAs at once, give each its "
                "own run_name and loaded model.")


def run_description(trainer) -> Callable[[], str]:
    """describe_run for `trainer`'s Busy: "run 'name' (at step N)". It reaches the trainer through a weak reference:
    a strong one would be a reference cycle (trainer -> Busy -> trainer), and a trainer dropped without close() would
    then hold its model set and its run folder's lock until Python's cyclic garbage collector happened to run."""
    ref = weakref.ref(trainer)

    def describe() -> str:
        t = ref()
        return f"run '{t.train_cfg.run_name}' (at step {t.step})" if t is not None else "a dropped trainer"
    return describe


def holds(what: str, nests: bool = True):
    """Decorator: a Trainer method that holds `self.busy` for its length (see `Busy.hold`)."""
    def wrap(method):
        @functools.wraps(method)
        def held(self, *args, **kwargs):
            with self.busy.hold(what, nests):
                return method(self, *args, **kwargs)
        return held
    return wrap
