"""Tracing links: what a role puts on and takes off the wire, as it happens.

A run of a PPF protocol can be silent for a minute; a progress display needs to know
what phase the run is in and how many bytes have moved.  :class:`TracedLink` wraps any
:class:`~fednorm.engine.runtime.Link` and tells a :class:`Tracer` about every frame,
reading only the frame's small header (sub-protocol and message kind), never its body.
:class:`TraceState` turns those events into a phase name, round counts and byte
totals that a terminal line or a log line can show.

The phase is what the wire says: work between frames (an encrypted inverse on the
server, say) shows as the phase of the last frame, with the clock still running.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import msgpack

from fednorm.engine.runtime import Link

_PEEK_BYTES = 512  # the header fields come first and are short
Direction = Literal["sent", "received"]


@dataclass(frozen=True)
class FrameEvent:
    """One frame through a traced link (``kind`` is empty if the header is unreadable)."""

    direction: Direction
    peer: str
    size: int
    protocol: str = ""
    kind: str = ""
    round: int = -1


class Tracer(Protocol):
    """Told about every frame of the links it traces; must return quickly."""

    def frame(self, event: FrameEvent) -> None: ...


def peek_header(frame: bytes) -> tuple[str, str, int]:
    """(protocol, kind, round) of an encoded frame, from its first bytes only."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(frame[:_PEEK_BYTES])
    try:
        unpacker.read_array_header()
        _version, protocol, _session, round_, _sender, kind = (unpacker.unpack()
                                                               for _ in range(6))
    except Exception:  # a truncated or foreign frame: trace it without a phase
        return "", "", -1
    if not (isinstance(protocol, str) and isinstance(kind, str) and isinstance(round_, int)):
        return "", "", -1
    return protocol, kind, round_


class TracedLink:
    """A link that reports every frame it carries to ``tracer``, then behaves as ``link``."""

    def __init__(self, link: Link, tracer: Tracer, peer: str) -> None:
        self.link = link
        self.tracer = tracer
        self.peer = peer

    async def send(self, frame: bytes) -> None:
        await self.link.send(frame)
        self._trace("sent", frame)

    async def receive(self) -> bytes:
        frame = await self.link.receive()
        self._trace("received", frame)
        return frame

    async def aclose(self) -> None:
        await self.link.aclose()

    def _trace(self, direction: Direction, frame: bytes) -> None:
        protocol, kind, round_ = peek_header(frame)
        self.tracer.frame(FrameEvent(direction, self.peer, len(frame), protocol, kind, round_))


def phase_of(protocol: str, kind: str) -> str:
    """A reader's name for the step a frame belongs to."""
    steps = protocol.split("/")[1:]
    if "setup" in steps:
        return "key setup"
    if "decrypt" in steps or "decrypt_sum" in steps:
        return "decryption"
    if "bootstrap" in steps:
        return "ciphertext refresh"
    if "kth" in steps or kind.startswith("rank."):
        return "rank search"
    if "minmax" in steps or kind.startswith("ppf_minmax."):
        return "extremes search"
    if kind.endswith(".result"):
        return "result"
    if "encrypted" in kind:
        return "encrypted upload"
    if "local_" in kind:
        return "upload"
    return "exchange"


@dataclass
class TraceState:
    """Running totals of one role's traffic, safe to read from another thread."""

    started: float = field(default_factory=time.monotonic)
    phase: str = "waiting for the first message"
    bytes_sent: int = 0
    bytes_received: int = 0
    frames: int = 0
    rounds: int = 0
    search_rounds: int = 0
    _probes: dict[str, int] = field(default_factory=dict, repr=False)
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
                self.phase = phase_of(event.protocol, event.kind)
            if event.kind == "rank.probe":  # one per search round on each link
                self._probes[event.peer] = self._probes.get(event.peer, 0) + 1
                self.search_rounds = max(self._probes.values())

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def line(self) -> str:
        """One line: phase, rounds, bytes so far, time."""
        with self._lock:
            phase = self.phase
            if phase == "rank search" and self.search_rounds:
                phase = f"rank search round {self.search_rounds}"
            return (f"{phase} · round {self.rounds} · {human_bytes(self.bytes_sent)} sent, "
                    f"{human_bytes(self.bytes_received)} received · {self.seconds:.0f} s")


class LineTracer:
    """A tracer for logs: one line through ``emit`` each time the phase or the round
    changes (a log is no terminal: no redrawing, so no line per frame)."""

    def __init__(self, emit: Callable[[str], None], label: str) -> None:
        self.emit = emit
        self.label = label
        self.state = TraceState()
        self._last: tuple[str, int] = ("", -1)

    def frame(self, event: FrameEvent) -> None:
        self.state.frame(event)
        now = (self.state.phase, self.state.rounds)
        if now != self._last:
            self._last = now
            self.emit(f"{self.label}: {self.state.line()}")


def human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{count} B"  # unreachable: the loop returns at GB
