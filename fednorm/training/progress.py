"""A dependency-free progress bar for long grids, on stderr so stdout stays clean.

On a terminal the bar redraws in place; when stderr is a file or pipe (a ``nohup`` log)
it prints one line per finished cell instead, which doubles as a run log.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    hours, rest = divmod(round(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


@dataclass
class Progress:
    """Counts finished cells out of ``total``; ``skipped`` were already in the results."""

    total: int
    skipped: int = 0
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    width: int = 24
    done: int = 0
    started: float = field(default_factory=time.perf_counter)

    def start(self) -> None:
        note = f", {self.skipped} already done" if self.skipped else ""
        self._emit(f"{self.total} runs to do{note}", final=True)

    def advance(self, label: str, seconds: float, failed: bool = False) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.started
        left = elapsed / self.done * (self.total - self.done)
        filled = self.width * self.done // max(self.total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        status = "FAILED " if failed else ""
        self._emit(
            f"[{bar}] {self.done}/{self.total} {format_duration(elapsed)} elapsed, "
            f"~{format_duration(left)} left | {status}{label} ({seconds:.1f} s)"
        )

    def close(self) -> None:
        if self._interactive:
            self.stream.write("\n")
            self.stream.flush()

    @property
    def _interactive(self) -> bool:
        return hasattr(self.stream, "isatty") and self.stream.isatty()

    def _emit(self, text: str, final: bool = False) -> None:
        if self._interactive and not final:
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
