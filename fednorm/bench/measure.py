"""Measuring on a shared machine: wall and CPU time, foreign load, environment, sections.

A benchmark here is only as good as the load it ran under: OpenFHE's OpenMP uses every
core inside each call, so on a 2-core machine one core busy with another process slows
a time 2-5x. Every :class:`Sample` therefore records, besides wall and process CPU time,
the busy time of all cores (/proc/stat), and :func:`foreign_load` turns that into the
average number of cores *other* processes kept busy while it was measured.

Sections report progress through :func:`step`, which advances the active progress bar
(:func:`reporting`) or logs a line on stderr.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fednorm.training.progress import Progress


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def git_state() -> str:
    """Commit of the working tree and whether fednorm/ has uncommitted changes (read-only)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                                  timeout=10).stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    dirty = [line[3:] for line in git("status", "--porcelain", "--", "fednorm").splitlines()]
    return commit + (f" + uncommitted changes in {', '.join(dirty)}" if dirty else "")


def environment() -> dict[str, str]:
    """Machine and library facts recorded with every section."""
    return {
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "ram": f"{_ram_gb():.1f} GiB",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "openfhe": _version("openfhe"),
        "numpy": _version("numpy"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
    }


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def _busy_seconds() -> float:
    """CPU-seconds all cores spent busy since boot (/proc/stat), NaN where unavailable."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def foreign_cores_now(window: float = 3.0) -> float:
    """Cores busy over the next ``window`` seconds while this process sleeps: the load
    other processes put on the machine right now."""
    busy, cpu = _busy_seconds(), time.process_time()
    time.sleep(window)
    return max(0.0, (_busy_seconds() - busy - (time.process_time() - cpu)) / window)


def wait_for_quiet(max_foreign: float, max_wait: float) -> str:
    """Wait (up to ``max_wait`` s) until other processes keep fewer than ``max_foreign``
    cores busy (3-s window); return the load average and what was seen."""
    start = time.monotonic()
    foreign = foreign_cores_now()
    while foreign >= max_foreign and time.monotonic() - start < max_wait:
        time.sleep(10)
        foreign = foreign_cores_now()
    waited = time.monotonic() - start
    return (f"{load_average()}; other processes busy on {foreign:.2f} cores at the start "
            f"(waited {waited:.0f} s for < {max_foreign})")


@dataclass
class Sample:
    """One measurement: wall and process CPU seconds, and all cores' busy seconds."""

    wall: float = 0.0
    cpu: float = 0.0
    busy: float = 0.0

    def __add__(self, other: Sample) -> Sample:
        return Sample(self.wall + other.wall, self.cpu + other.cpu, self.busy + other.busy)


class Meter:
    """``with Meter() as m: ...`` then ``m.sample``."""

    sample: Sample

    def __enter__(self) -> Meter:
        self._t = (time.perf_counter(), time.process_time(), _busy_seconds())
        return self

    def __exit__(self, *exc: object) -> None:
        wall, cpu, busy = self._t
        self.sample = Sample(time.perf_counter() - wall, time.process_time() - cpu,
                             _busy_seconds() - busy)


def measure(fn: Callable[[], Any]) -> tuple[Any, Sample]:
    with Meter() as m:
        out = fn()
    return out, m.sample


def foreign_load(samples: list[Sample]) -> float:
    """Average cores busy with *other* processes over these samples (>= 0)."""
    wall = sum(s.wall for s in samples)
    if wall <= 0:
        return float("nan")
    return max(0.0, (sum(s.busy for s in samples) - sum(s.cpu for s in samples)) / wall)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- sections and rendering ---------------------------------------------------------------
@dataclass
class Section:
    """One benchmark section: machine-readable rows plus what the Markdown shows."""

    key: str
    title: str
    rows: list[dict[str, Any]]
    tables: list[tuple[str, list[str], list[list[str]]]]  # (caption, header, cells)
    notes: list[str] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)

    def markdown(self, level: int = 2, skip: tuple[str, ...] = ()) -> str:
        """The section in Markdown; ``skip``: meta keys a report header already shows."""
        out = ["#" * level + f" {self.title}", ""]
        out += [f"- **{k}**: {v}" for k, v in self.meta.items() if k not in skip]
        out.append("")
        for caption, header, cells in self.tables:
            if caption:
                out += [caption, ""]
            out.append(md_table(header, cells))
            out.append("")
        out += [f"{note}\n" for note in self.notes]
        return "\n".join(out).rstrip() + "\n"


def md_table(header: list[str], cells: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def fmt_ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "–"
    ms = seconds * 1e3
    return f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def fmt_or_dash(x: float, spec: str) -> str:
    return "–" if math.isnan(x) else format(x, spec)


def met(value: float, target: float) -> str:
    """'yes' / '**no**' for value ≤ target; '–' without a target."""
    if math.isnan(target):
        return "–"
    return "yes" if value <= target else "**no**"


def sci(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.2e}"


def section_meta(command: str, started: datetime.datetime, load_before: str) -> dict[str, str]:
    env = environment()
    return {
        "command": f"`{command}`",
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{env['machine']}, {env['cpu']}, {env['cores']} cores, "
                   f"{env['ram']} RAM, {env['os']}",
        "versions": f"Python {env['python']}, openfhe {env['openfhe']}, "
                    f"numpy {env['numpy']}, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}",
        "fednorm": git_state(),
        "load average (1/5/15 min) before": load_before,
    }


def finish(section: Section, started: float) -> Section:
    section.meta["load average (1/5/15 min) after"] = load_average()
    section.meta["section wall time"] = f"{time.perf_counter() - started:.0f} s"
    return section


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.2f}] {text}",
          file=sys.stderr, flush=True)


_progress: list[Progress] = []


@contextmanager
def reporting(progress: Progress) -> Iterator[Progress]:
    """Route :func:`step` to ``progress`` for the duration of the block."""
    _progress.append(progress)
    progress.start()
    try:
        yield progress
    finally:
        progress.close()
        _progress.pop()


def step(label: str, seconds: float) -> None:
    """One planned unit of work is done: advance the progress bar, or log it."""
    if _progress:
        _progress[-1].advance(label, seconds)
    else:
        log(f"{label} ({seconds:.1f} s)")


def now() -> tuple[datetime.datetime, float]:
    """The UTC start of a section and a perf counter to time it with."""
    return datetime.datetime.now(datetime.timezone.utc), time.perf_counter()

