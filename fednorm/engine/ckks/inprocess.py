"""Runs whose roles all share this process (a simulation), and what they may share.

While one is under way, objects that every role would otherwise make alike (a parse of
a broadcast's bytes, a product of the parties' uploads, a step of a running sum of key
shares) are made by the first role and handed to the others; the last run to end lets
it all go.  Elsewhere (one role per process) nothing is shared or kept.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

_RUNS = 0  # simulations under way
_LOCK = threading.Lock()


class Keeper(Protocol):
    """Something that keeps objects for the roles of an in-process run."""

    def forget_objects(self) -> None: ...


_KEEPERS: weakref.WeakSet[Keeper] = weakref.WeakSet()  # whose memory the last run frees


def active() -> bool:
    """Whether an in-process run is under way."""
    return _RUNS > 0


def keep_for_runs(keeper: Keeper) -> None:
    """Have ``keeper`` forget what it kept when the last in-process run ends."""
    _KEEPERS.add(keeper)


@contextmanager
def in_process_run() -> Iterator[None]:
    """Mark a run whose roles all share this process (a simulation): while one is under
    way, :meth:`~.context.CkksContext.from_bytes` keeps what it parsed for a broadcast's
    other readers, up to :data:`~.context.RECENT_BYTES`, and the last run to end lets it
    all go.  Elsewhere (one role per process) no bytes are read twice, and nothing is
    kept."""
    global _RUNS
    with _LOCK:
        _RUNS += 1
    try:
        yield
    finally:
        with _LOCK:
            _RUNS -= 1
            if not _RUNS:
                for keeper in list(_KEEPERS):
                    keeper.forget_objects()
