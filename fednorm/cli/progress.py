"""Progress on stderr while a run is under way: phase, rounds, bytes so far, seconds.

A PPF run at the paper preset can be silent for a minute or more; one line, redrawn
twice a second, tells a slow run from a hung one.  It is drawn only when stderr is a
terminal and neither ``--json`` nor ``--quiet`` was given, so logs and pipes stay
clean.  The figures come from a :class:`~fednorm.protocols.progress.TraceState` that the
role context's tracer hooks feed: the phases it opens (key setup, the encrypted inverse,
a search with its planned rounds) and every frame.
"""

from __future__ import annotations

import argparse
import sys
import threading
from types import TracebackType
from typing import TextIO

from fednorm.protocols.progress import StateTracer, TraceState

CLEAR_LINE = "\r\x1b[K"
REDRAW_SECONDS = 0.5


class TerminalProgress(StateTracer):
    """A tracer that keeps one status line on a terminal, and logs above it."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        super().__init__()
        self.label = label
        self.stream = stream or sys.stderr
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._redraw, daemon=True)

    def changed(self, phase_before: str) -> None:
        """A new phase is drawn at once, so that even a phase shorter than the redraw
        interval shows."""
        if self.state.phase != phase_before and self._thread.is_alive():
            with self._lock:
                self._draw()

    def log(self, message: str) -> None:
        """Print a log line without tearing the status line."""
        with self._lock:
            self.stream.write(f"{CLEAR_LINE}{message}\n")
            self._draw()

    def __enter__(self) -> TerminalProgress:
        self.state = TraceState()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        with self._lock:
            self.stream.write(CLEAR_LINE)
            self.stream.flush()

    def _redraw(self) -> None:
        while not self._stop.wait(REDRAW_SECONDS):
            with self._lock:
                self._draw()

    def _draw(self) -> None:
        self.stream.write(f"{CLEAR_LINE}{self.label}: {self.state.line()}")
        self.stream.flush()


def wants_progress(args: argparse.Namespace, stream: TextIO | None = None) -> bool:
    """Progress only for a person watching: a terminal, without --json or --quiet."""
    if getattr(args, "json", False) or getattr(args, "quiet", False):
        return False
    stream = stream or sys.stderr
    return stream.isatty()


def progress_for(args: argparse.Namespace, label: str) -> TerminalProgress | None:
    return TerminalProgress(label) if wants_progress(args) else None


def add_quiet_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true",
                        help="no progress line on stderr (there is none when stderr is not "
                             "a terminal either)")
