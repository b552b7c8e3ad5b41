"""Progress of a role, read from its tracer events: phase, rounds, bytes, time.

A run of a PPF protocol can be silent for a minute; a progress display needs to know
what phase the run is in and how many bytes have moved.  :class:`TraceState` is a
tracer (:mod:`fednorm.engine.tracing`) that a role context feeds: the phases the
protocol opens (key setup, the encrypted inverse, a search with its planned rounds)
and every frame's kind and size; it turns them into one line a terminal or a log can
show.  Between frames and outside any named phase, the phase is what the wire said
last, with the clock still running.  (Links are not wrapped: the role context
reports what it sends and receives, with the decoded header.)

Naming a step takes knowing the protocols: their sub-protocol scopes (``setup``,
``decrypt``, ``kth``, ...) and message kinds (``rank.probe``, ``ppf_minmax.*``), so this
reader lives with them, not in the transport layer, which knows bytes only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fednorm.engine.tracing import FrameEvent, PhaseEvent, Tracer

__all__ = ["LineTracer", "StateTracer", "TraceState", "human_bytes", "phase_of"]


DECRYPTIONS = frozenset({"decrypt", "decrypt_sum", "decrypt_product", "decrypt_coefficients"})
"""The sub-protocols of collective decryption, of every kind."""


def phase_of(protocol: str, kind: str) -> str:
    """A reader's name for the step a frame (or a sub-protocol scope) belongs to."""
    steps = protocol.split("/")[1:]
    if "setup" in steps:
        return "key setup"
    if DECRYPTIONS.intersection(steps):
        return "decryption"
    if "bootstrap" in steps:
        return "ciphertext refresh"
    if "kth" in steps or kind.startswith("rank."):
        return "rank search"
    if "minmax" in steps or "extremes" in steps or kind.startswith(("ppf_minmax.",
                                                                    "ppf_extremes.")):
        return "extremes search"
    if kind.endswith(".result"):
        return "result"
    if "encrypted" in kind:
        return "encrypted upload"
    if "local_" in kind:
        return "upload"
    return "exchange"


STEP_LABELS = {"upload": "encrypted upload", "search": "search"}
"""Labels of protocol steps (``RoleContext.phase``) where the step's name is not one."""


def scope_label(event: PhaseEvent) -> str:
    """A reader's name for a phase a role opened."""
    if event.subprotocol:
        label = phase_of(event.protocol, "")
        return event.name if label == "exchange" else label
    return STEP_LABELS.get(event.name, event.name)


@dataclass
class TraceState:
    """Running totals of one role's traffic and phases, safe to read from another thread."""

    started: float = field(default_factory=time.monotonic)
    phase: str = "waiting for the first message"
    bytes_sent: int = 0
    bytes_received: int = 0
    frames: int = 0
    rounds: int = 0
    search_rounds: int = 0
    planned_rounds: int | None = None
    _wire_phase: str = field(default="waiting for the first message", repr=False)
    _scopes: list[tuple[str, str, int | None]] = field(default_factory=list, repr=False)
    _probes: dict[str, int] = field(default_factory=dict, repr=False)
    _round_marker: tuple[str, str] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def frame(self, event: FrameEvent) -> None:
        with self._lock:
            self.frames += 1
            if event.direction == "sent":
                self.bytes_sent += event.size
            else:
                self.bytes_received += event.size
                self.rounds = max(self.rounds, event.round + 1)
            if event.kind:
                self._wire_phase = phase_of(event.protocol, event.kind)
            if self.planned_rounds is not None:
                self._count_planned_round(event)
            elif event.kind == "rank.probe":  # one per search round on each link
                self._probes[event.peer] = self._probes.get(event.peer, 0) + 1
                self.search_rounds = max(self._probes.values())
            self._update_phase()

    def _count_planned_round(self, event: FrameEvent) -> None:
        """In a phase with planned rounds, a round is each repeat of the first message the
        role sent in it (to the same peer): a probe on the server, counts on a party."""
        if event.direction != "sent":
            return
        if self._round_marker is None:
            self._round_marker = (event.peer, event.kind)
        if (event.peer, event.kind) == self._round_marker:
            self.search_rounds += 1

    def phase_started(self, event: PhaseEvent) -> None:
        with self._lock:
            self._scopes.append((event.name, scope_label(event), event.planned_rounds))
            if event.planned_rounds is not None:
                self._probes.clear()
                self._round_marker = None
                self.search_rounds = 0
            self._update_phase()

    def phase_ended(self, event: PhaseEvent) -> None:
        with self._lock:
            names = [name for name, _, _ in self._scopes]
            if event.name in names:  # the innermost scope of that name
                del self._scopes[len(names) - 1 - names[::-1].index(event.name)]
            self._update_phase()

    def _update_phase(self) -> None:
        """The innermost open phase, under the steps around it; else the wire's phase."""
        steps = [label for _, label, _ in self._scopes]
        labels = [label for i, label in enumerate(steps) if i == 0 or label != steps[i - 1]]
        self.phase = " › ".join(labels[-2:]) if labels else self._wire_phase
        planned = [rounds for _, _, rounds in self._scopes if rounds is not None]
        self.planned_rounds = planned[-1] if planned else None

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def line(self, rounds: str | None = None) -> str:
        """One line: phase (with its search round, of ~the plan's), the run's round
        counter (``rounds``, by default the protocol's: "round 7"), bytes, time."""
        with self._lock:
            phase = self.phase
            if self.search_rounds and ("search" in phase or self.planned_rounds):
                phase = f"{phase} round {self.search_rounds}"
                if self.planned_rounds:
                    phase += f" of ~{self.planned_rounds}"
            rounds = rounds or f"round {self.rounds}"
            return (f"{phase} · {rounds} · {human_bytes(self.bytes_sent)} sent, "
                    f"{human_bytes(self.bytes_received)} received · {self.seconds:.0f} s")


class StateTracer(Tracer):
    """A tracer that keeps a :class:`TraceState` and calls :meth:`changed` after each
    event it feeds it (a display decides there whether to show something)."""

    def __init__(self) -> None:
        self.state = TraceState()

    def frame(self, event: FrameEvent) -> None:
        before = self.state.phase
        self.state.frame(event)
        self.changed(before)

    def phase_started(self, event: PhaseEvent) -> None:
        before = self.state.phase
        self.state.phase_started(event)
        self.changed(before)

    def phase_ended(self, event: PhaseEvent) -> None:
        before = self.state.phase
        self.state.phase_ended(event)
        self.changed(before)

    def changed(self, phase_before: str) -> None:
        """The state took one event; ``phase_before`` is the phase before it."""


class LineTracer(StateTracer):
    """A tracer for logs: one line through ``emit`` each time the phase or the round
    changes (a log is no terminal: no redrawing, so no line per frame).

    ``rounds`` says which round the run counts, named ("Flower round 8"), when it is not
    the protocol's: a line carries one round counter, so a reader never has to guess
    which of two a bare "round 7" means."""

    def __init__(self, emit: Callable[[str], None], label: str,
                 rounds: Callable[[], str] | None = None) -> None:
        super().__init__()
        self.emit = emit
        self.label = label
        self._rounds = rounds or (lambda: f"round {self.state.rounds}")
        self._last: tuple[str, str] = ("", "")

    def changed(self, phase_before: str) -> None:
        now = (self.state.phase, self._rounds())
        if now != self._last:
            self._last = now
            self.emit(f"{self.label}: {self.state.line(now[1])}")


def human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{count} B"  # unreachable: the loop returns at GB
