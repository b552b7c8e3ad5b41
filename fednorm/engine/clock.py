"""Trio's clock without the time the process did not run, and the one way fednorm
starts a trio run.

A role waits at most its timeout for a peer's next frame: that catches a peer that
stalled. Counted on the monotonic clock alone, a process that is itself stopped for
longer (SIGSTOP to lend the cores to another job, a debugger's breakpoint) wakes to
find every pending deadline past, and fails each run that was waiting mid-protocol,
although no peer stalled: a study grid paused for a benchmark died of it. (A machine
asleep is no such case: the monotonic clock itself stops then.)

:class:`RunningClock` makes the event loop wake at least every :data:`TICK` seconds, so
two readings of the clock are never further apart than a tick plus the work between
them; a larger gap means the process did not run, and everything in it beyond one tick
is left out of trio's time. Deadlines and sleeps then count only time the process ran.
A peer that stalls still times out: its silence passes in ticks the process runs.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

TICK = 0.5
"""The longest the event loop sleeps before it reads the clock again (seconds)."""

STOPPED_AFTER = 2 * TICK
"""A gap between two readings longer than this is a stop, not a sleep."""

T = TypeVar("T")


class RunningClock(trio.abc.Clock):
    """The monotonic clock minus the gaps in which the process was stopped."""

    def __init__(self, source: Callable[[], float] = time.monotonic) -> None:
        self._source = source
        self._last = 0.0
        self._skipped = 0.0

    def start_clock(self) -> None:
        self._last = self._source()

    def current_time(self) -> float:
        now = self._source()
        gap = now - self._last
        if gap > STOPPED_AFTER:
            self._skipped += gap - TICK
        self._last = now
        return now - self._skipped

    def deadline_to_sleep_time(self, deadline: float) -> float:
        return max(0.0, min(deadline - self.current_time(), TICK))

    @property
    def skipped(self) -> float:
        """Seconds left out so far."""
        return self._skipped


def run_trio(async_fn: Callable[..., Awaitable[T]], *args: object) -> T:
    """``trio.run(async_fn, *args)`` on a :class:`RunningClock`."""
    return trio.run(async_fn, *args, clock=RunningClock())
