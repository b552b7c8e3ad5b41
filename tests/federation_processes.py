"""Real ``fednorm serve`` / ``fednorm party`` processes over loopback, for the tests that
run a federation across processes: data files, starting roles, and reading how each ended.
The ``spawn`` and ``csvs`` fixtures (conftest) use these."""

from __future__ import annotations

import os
import re
import select
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
STALL_PARTY = Path(__file__).parent / "tcp_stall_party.py"
FEATURES = ["a", "b", "c"]
HEADER = ["a", "label", "b", "c"]


def party_arrays(sizes: tuple[int, ...] = (40, 55, 30), seed: int = 0) -> list[np.ndarray]:
    """Non-IID parties: shifted, differently spread columns, some values missing."""
    rng = np.random.default_rng(seed)
    parts = []
    for i, n in enumerate(sizes):
        X = np.column_stack([rng.normal(i, 1 + i, n), rng.exponential(2 + i, n),
                             rng.integers(0, 5, n).astype(float)])
        X[rng.random(n) < 0.1, 1] = np.nan
        parts.append(X)
    return parts


def write_csv(path: Path, X: np.ndarray) -> Path:
    """Columns a, label, b, c: the target sits between features; NaN is an empty cell."""
    lines = [",".join(HEADER)]
    for r, row in enumerate(X):
        cells = ["" if np.isnan(v) else repr(float(v)) for v in row]
        lines.append(",".join([cells[0], "yes" if r % 3 else "no", *cells[1:]]))
    path.write_text("\n".join(lines) + "\n")
    return path


def start_server(spawn: Callable[..., subprocess.Popen[bytes]], certs: Path, method: str,
                 out: Path, *extra: object, **kwargs: object
                 ) -> tuple[subprocess.Popen[bytes], int]:
    proc = spawn("serve", "--bind", "127.0.0.1:0", "--parties", 3, "--method", method,
                 "--certs", certs, "--out", out, "--timeout", 60, "--join-timeout", 20,
                 *extra, **kwargs)
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline().decode() if ready else ""  # type: ignore[union-attr]
    match = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)\n", line)
    if match is None:
        proc.kill()
        raise AssertionError(f"server did not start: {line!r} {proc.communicate()[1]!r}")
    return proc, int(match.group(1))


def start_party(spawn: Callable[..., subprocess.Popen[bytes]], port: int, party: int,
                data: Path, certs: Path, out: Path, *extra: object, timeout: float = 10,
                trusting: bool = True, **kwargs: object) -> subprocess.Popen[bytes]:
    """``fednorm party``; ``trusting``: it joins sessions of the paper's algorithms
    (``--allow-paper-algorithms``), which tests of other matters run."""
    trust = ["--allow-paper-algorithms"] if trusting else []
    return spawn("party", "--connect", f"127.0.0.1:{port}", "--id", party, "--data", data,
                 "--target", "label", "--certs", certs, "--out", out, "--timeout", timeout,
                 "--join-timeout", 20, *trust, *extra, **kwargs)


def finish(proc: subprocess.Popen[bytes], timeout: float = 30) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        err = proc.communicate()[1]
        raise AssertionError(f"still running after {timeout} s: {err!r}") from None
    return proc.returncode, (err or b"").decode()  # None: stderr went elsewhere


def read_until(proc: subprocess.Popen[bytes], text: str, timeout: float = 30) -> str:
    """Read ``proc``'s stderr until ``text`` appears; return what was read."""
    assert proc.stderr is not None
    seen = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stderr], [], [], max(remaining, 0))
        chunk = os.read(proc.stderr.fileno(), 65536) if ready else b""
        assert chunk, f"no {text!r} within {timeout} s: {seen.decode()!r}"
        seen += chunk
    return seen.decode()



def nothing_written(outs: list[Path]) -> bool:
    return all(not out.exists() or not any(out.iterdir()) for out in outs)


def assert_one_cause(results: list[tuple[int, str]], cause: str) -> None:
    """Every role names the same cause (the server's, verbatim) in what it prints."""
    for code, err in results:
        assert code in (1, 2), err
        assert cause in err, f"{cause!r} not in {err!r}"
        assert "Traceback" not in err and "Broken pipe" not in err, err



def write_rows(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    path.write_text("\n".join(",".join(map(str, row)) for row in [header, *rows]) + "\n")
    return path
