"""What the Flower tests share: the example app's partitions, the numpy oracle of its
fits, and the party workers a test must see gone."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fednorm.protocols import FitOptions
from fednorm.sim.federation import simulate

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "flower_robust"
NODES = 3

sys.path.insert(0, str(EXAMPLE))
from flower_robust.task import load_partition  # noqa: E402


def short_private_dir(prefix: str) -> Path:
    """A 0700 directory with a short path: Unix socket paths are limited to 107 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def worker_processes(pipe_dir: Path) -> list[int]:
    """Pids of processes whose command line names ``pipe_dir`` (party workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if os.fsencode(pipe_dir) in cmdline and b"fednorm.flower.worker" in cmdline:
            found.append(int(entry.name))
    return found


def wait_until_gone(pipe_dir: Path, seconds: float = 20.0) -> None:
    """Workers end with their role: none may be left, nor its socket."""
    deadline = time.monotonic() + seconds
    while worker_processes(pipe_dir) or any(pipe_dir.iterdir()):
        if time.monotonic() > deadline:
            raise AssertionError(f"party workers left behind: {worker_processes(pipe_dir)}, "
                                 f"{list(pipe_dir.iterdir())}")
        time.sleep(0.2)


def expected_normalizer(partition_ids: list[int], method: str, privacy: str,
                        options: FitOptions) -> dict[str, list[float]]:
    """The in-memory simulation on the same rows, party i holding ``partition_ids[i-1]``."""
    parts = [load_partition(pid, NODES).X_train for pid in partition_ids]
    return simulate(parts, method, privacy, options).normalizer.params()


def pooled_training_rows() -> np.ndarray:
    """The example's training rows of every node, pooled."""
    return np.vstack([load_partition(pid, NODES).X_train for pid in range(NODES)])


def check_quartiles_against_numpy(params: dict[str, list[float]], relative_epsilon: float
                                  ) -> None:
    """The oracle: numpy's quartiles of the pooled rows, to the rank search's precision
    (each quartile within ε = relative_epsilon × the feature's range)."""
    pooled = pooled_training_rows()
    eps = relative_epsilon * (pooled.max(axis=0) - pooled.min(axis=0))
    for name, q in zip(("q1", "median", "q3"), (25, 50, 75), strict=True):
        expected = np.percentile(pooled, q, axis=0)
        assert np.all(np.abs(np.array(params[name]) - expected) <= eps), name
