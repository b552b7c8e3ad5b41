"""Tracer hooks of a role: what it does, as it happens, for whoever wants to watch.

A :class:`~fednorm.engine.runtime.RoleContext` reports to its tracers every phase it
enters and leaves (a sub-protocol scope such as key setup or a decryption, or a named
step such as the encrypted inverse), every message it sends or receives (kind, size,
round, the frame itself), and every heavy call it runs in a worker thread (its name
and duration).  A progress display, a benchmark and a recording test transport all
read the same events, so none of them has to wrap links or patch library functions.

The model is trio's ``abc.Instrument``: a tracer defines only the hooks it wants; the
others cost nothing.  Hooks run on the event loop and must return quickly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

Direction = Literal["sent", "received"]
HOOKS = ("phase_started", "phase_ended", "frame", "crypto_call")


@dataclass(frozen=True)
class FrameEvent:
    """One message a role sent or received (``kind`` empty if its header is unreadable).

    ``role`` is the tracing role, ``peer`` the other end; ``frame`` and ``message`` are
    the bytes on the wire and their decoded message (left out of comparisons)."""

    direction: Direction
    peer: str
    size: int
    protocol: str = ""
    kind: str = ""
    round: int = -1
    role: str = ""
    frame: bytes = field(default=b"", repr=False, compare=False)
    message: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class PhaseEvent:
    """A phase of ``role``: a sub-protocol scope (``protocol`` is then its frame id) or a
    named step inside ``protocol``.  ``seconds`` is its duration when it ends (0 at the
    start); ``planned_rounds`` what the protocol expects, where its plan says."""

    role: str
    protocol: str
    name: str
    subprotocol: bool
    seconds: float = 0.0
    planned_rounds: int | None = None


@dataclass(frozen=True)
class CryptoEvent:
    """One heavy call a role ran in a worker thread (``RoleContext.run_sync``) and what
    it returned (a decryption's values, a ciphertext, ...; left out of comparisons)."""

    role: str
    protocol: str
    call: str
    seconds: float
    result: Any = field(default=None, repr=False, compare=False)


class Tracer:
    """Base class of tracers: override the hooks you need (each is optional; an object
    of any class that defines some of these methods works as well)."""

    def phase_started(self, event: PhaseEvent) -> None:
        """A phase begins."""

    def phase_ended(self, event: PhaseEvent) -> None:
        """A phase ends (also when it fails)."""

    def frame(self, event: FrameEvent) -> None:
        """A message was sent or received."""

    def crypto_call(self, event: CryptoEvent) -> None:
        """A worker-thread call returned."""


def _hook(tracer: object, name: str) -> Any:
    """``tracer``'s hook ``name``, or None where it has none or keeps the no-op."""
    method = getattr(tracer, name, None)
    if method is None or getattr(method, "__func__", None) is getattr(Tracer, name):
        return None
    return method


class Tracers:
    """The hooks of any number of tracers, each called only where a tracer defines it."""

    def __init__(self, tracers: Iterable[object] = ()) -> None:
        listed = list(tracers)
        self._hooks = {name: [h for t in listed if (h := _hook(t, name)) is not None]
                       for name in HOOKS}

    @classmethod
    def of(cls, tracer: object | Iterable[object] | None) -> Tracers:
        """From one tracer, a list of them, or None."""
        if tracer is None:
            return cls()
        if isinstance(tracer, (list, tuple)):
            return cls(tracer)
        return cls([tracer])

    def wants(self, hook: str) -> bool:
        return bool(self._hooks[hook])

    def emit(self, hook: str, event: object) -> None:
        for call in self._hooks[hook]:
            call(event)
