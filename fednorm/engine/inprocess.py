"""Runs whose roles all share this process (a simulation), and what they may share.

While one is under way, objects that every role would otherwise make alike (a parse of
a broadcast's bytes, a product of the parties' uploads, a step of a running sum of key
shares) are made by the first role and handed to the others; the last run to end lets
it all go.  Elsewhere (one role per process) nothing is shared or kept.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

_RUNS = 0  # simulations under way
_LOCK = threading.Lock()
T = TypeVar("T")
SHARED_FRAME_BYTES = 256 * 2**20
"""Bytes of the frames whose parses are kept for their other readers (the oldest go)."""


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
    way, the roles share a frame object's parse (:func:`parsed_once`), a crypto object's
    parse (:meth:`~fednorm.engine.ckks.context.CkksContext.from_bytes`) and what else the
    module docstring names, and the last run to end lets it all go.  Elsewhere (one role
    per process) no bytes are read twice, and nothing is kept."""
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
                _PARSES.clear()


@dataclass
class _Parse:
    """One frame object's parse, made by its first reader."""

    frame: bytes  # held, so that no other object takes its id while the parse is kept
    lock: threading.Lock = field(default_factory=threading.Lock)
    result: Any = None
    shared: bool = False


_PARSES: dict[int, _Parse] = {}  # by id of the frame object, oldest first


def parsed_once(frame: bytes, parse: Callable[[bytes], T],
                shareable: Callable[[T], bool]) -> T:
    """``parse(frame)``; in an in-process run, the readers of one frame object (a
    broadcast waits in every link as one object) share the first reader's parse, if
    ``shareable`` says it may be shared, instead of each parsing the same bytes again
    (each host parses its own copy, at the same time, in a deployment).  The others
    wait for the first; a failed parse is not kept (each reader fails alike)."""
    if not active():
        return parse(frame)
    entry = _entry(frame)
    with entry.lock:
        if entry.shared:
            return entry.result  # type: ignore[no-any-return]
        result = parse(frame)
        if shareable(result):
            entry.result, entry.shared = result, True
        return result


def shared_parse(frame: bytes) -> Any | None:
    """The parse another reader of ``frame`` already shared (:func:`parsed_once`), or None
    (none yet, or not in an in-process run): looked up without waiting."""
    if not active():
        return None
    with _LOCK:
        entry = _PARSES.get(id(frame))
    return entry.result if entry is not None and entry.shared else None


def _entry(frame: bytes) -> _Parse:
    with _LOCK:
        entry = _PARSES.get(id(frame))  # a kept entry holds its frame: the id is its own
        if entry is None:
            entry = _PARSES[id(frame)] = _Parse(frame)
            kept = sum(len(e.frame) for e in _PARSES.values())
            while kept > SHARED_FRAME_BYTES and len(_PARSES) > 1:
                kept -= len(_PARSES.pop(next(iter(_PARSES))).frame)
        return entry
