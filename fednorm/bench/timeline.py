"""Where a protocol run's time goes, from the role contexts' tracer hooks.

:class:`Timeline` is a tracer (:mod:`fednorm.engine.tracing`): given to the server it
sums the server's phases (key setup, decryptions, bootstraps, the k-th search, named
steps such as the encrypted inverse), each exclusive of the phases inside it; given to
every role it also sums the worker-thread calls by name (encryption, decryption shares,
serialization, ...), and keeps the plaintext vectors the server's decryptions
finalized (what they revealed, in order: a decryption the server decodes itself returns
slot values from its aggregation too, which are not counted again).  Nothing is
wrapped or patched: the benchmark reads the run the way a progress display does.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from fednorm.engine.runtime import SERVER, role_name
from fednorm.engine.tracing import CryptoEvent, PhaseEvent, Tracer

SERVER_NAME = role_name(SERVER)
SERIALIZATION_CALLS = frozenset({"encode_body", "decode_frame", "decode_received"})
"""Worker calls that turn messages into bytes and back: work a run in one process could
avoid, so they are not part of :meth:`Timeline.limit_seconds`."""


@dataclass
class _Open:
    name: str
    inner: float = 0.0  # seconds of the phases nested inside


@dataclass
class Timeline(Tracer):
    """Phase and call totals of one run (seconds): ``phases`` each without the phases
    nested in it, ``inclusive`` with them."""

    phases: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    inclusive: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    phase_counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    call_counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    revealed: list[np.ndarray] = field(default_factory=list)
    _open: list[_Open] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def phase_started(self, event: PhaseEvent) -> None:
        if event.role == SERVER_NAME:
            self._open.append(_Open(event.name))

    def phase_ended(self, event: PhaseEvent) -> None:
        if event.role != SERVER_NAME or not self._open:
            return
        done = self._open.pop()
        self.phases[event.name] += event.seconds - done.inner
        self.inclusive[event.name] += event.seconds
        self.phase_counts[event.name] += 1
        if self._open:
            self._open[-1].inner += event.seconds

    def crypto_call(self, event: CryptoEvent) -> None:
        with self._lock:
            self.calls[event.call] += event.seconds
            self.call_counts[event.call] += 1
        if (event.role == SERVER_NAME and event.call.endswith(".finalize")
                and _is_plaintext(event.result)):
            self.revealed.append(np.asarray(event.result))

    def limit_seconds(self, cores: int) -> float:
        """The run's crypto work spread over ``cores`` cores: every role's crypto calls
        (key and decryption shares, encryptions, the server's aggregations and homomorphic
        operations, the bootstraps' shares) summed; serialization, transport and waiting
        left out. The calls are timed as the run made them, two at a time, so this is
        the wall time the run would take if nothing but those calls cost anything."""
        work = sum(s for call, s in self.calls.items() if call not in SERIALIZATION_CALLS)
        return work / cores

    def serialization_seconds(self) -> float:
        """Every role's time turning messages into bytes and back (worker calls)."""
        return sum(s for call, s in self.calls.items() if call in SERIALIZATION_CALLS)

    def beyond_limit(self, wall: float, cpu: float, cores: int) -> dict[str, float]:
        """Two costs that keep a run's wall time above :meth:`limit_seconds`, in
        core-seconds: serialization (every role's encoding and parsing of frames in worker
        threads, timed as the calls ran; frames under 64 KiB are parsed inline, untimed)
        and cores left idle (``cores`` × ``wall`` minus the process's CPU time: waiting
        on the one role whose turn it is). Which is larger says what the wall time loses
        most to."""
        return {"serialization": self.serialization_seconds(),
                "idle": max(cores * wall - cpu, 0.0)}

    def outside_phases(self, total: float) -> float:
        """The server's time in no phase at all (local sums, broadcasts, waiting)."""
        return total - sum(self.phases.values())


def _is_plaintext(value: object) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.ndim == 1
