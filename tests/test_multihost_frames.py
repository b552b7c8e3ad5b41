"""``--max-frame``: the frame limit of a multi-host role reaches its links.

No frame grows with the number of parties (tests/test_relay_frames.py); the largest,
one party's key shares, are 30-54 MiB at the paper preset, under the default 64 MiB.  A
role with a smaller limit (or a larger ring) is stopped with one cause on every role."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from federation_processes import (
    assert_one_cause,
    finish,
    nothing_written,
    start_party,
    start_server,
)


def test_a_server_limited_to_one_mib_refuses_the_key_shares_it_would_forward(
    spawn: Callable[..., subprocess.Popen[bytes]], certs: Path, csvs: list[Path],
    tmp_path: Path,
) -> None:
    """The lead's key shares (2.6 MB at the test preset) are over a 1 MiB limit: the
    server refuses the frame (reading its bytes, so the lead's send completes) and stops
    the session, and every role names the limit, the lead too."""
    outs = [tmp_path / f"out-{role}" for role in range(4)]
    server, port = start_server(spawn, certs, "zscore", outs[0], "--privacy", "mhe",
                                "--preset", "test", "--max-frame", 1)
    parties = [start_party(spawn, port, p, csvs[p - 1], certs, outs[p], timeout=60)
               for p in (1, 2, 3)]
    results = [finish(proc, timeout=120) for proc in [server, *parties]]
    assert_one_cause(results, f"bytes; the limit is {1 << 20}")
    assert all("party 1 announced a frame of" in err for _, err in results)
    assert nothing_written(outs)


def test_a_party_limited_to_one_mib_refuses_the_key_shares_forwarded_to_it(
    spawn: Callable[..., subprocess.Popen[bytes]], certs: Path, csvs: list[Path],
    tmp_path: Path,
) -> None:
    """The party side of the option: party 2, at 1 MiB, refuses the lead's forwarded key
    shares and names its limit; nothing is written anywhere."""
    outs = [tmp_path / f"out-{role}" for role in range(4)]
    server, port = start_server(spawn, certs, "zscore", outs[0], "--privacy", "mhe",
                                "--preset", "test")
    parties = [start_party(spawn, port, p, csvs[p - 1], certs, outs[p],
                           *(["--max-frame", 1] if p == 2 else []), timeout=60)
               for p in (1, 2, 3)]
    results = [finish(proc, timeout=120) for proc in [server, *parties]]
    assert all(code == 1 for code, _ in results), results
    assert f"the limit is {1 << 20}" in results[2][1], results[2]
    assert nothing_written(outs)
