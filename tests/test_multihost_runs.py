"""``fednorm serve`` and ``fednorm party`` over loopback TCP + TLS (fednorm.multihost):
real processes fit what the in-memory simulation fits, one session of several methods,
progress on a terminal, and a role that dies, or a session that cannot run, stopping
every role with one cause and nothing written."""

from __future__ import annotations

import csv
import json
import os
import pty
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import trio
from federation_processes import (
    FEATURES,
    HEADER,
    STALL_PARTY,
    assert_one_cause,
    finish,
    nothing_written,
    party_arrays,
    read_until,
    start_party,
    start_server,
    write_rows,
)
from recording import KEY_SETUP_KINDS, Recorder, SecretKeySpy, session_kinds

from fednorm.multihost.config import PartyConfig, ServerConfig, Timeouts
from fednorm.multihost.files import load_party_data
from fednorm.multihost.party import Party, PartyRun
from fednorm.multihost.server import Server
from fednorm.protocols import FitOptions
from fednorm.sim.federation import simulate


def read_params(out: Path) -> dict[str, np.ndarray]:
    document = json.loads((out / "params.json").read_text())
    assert document["features"] == FEATURES
    return {k: np.array([np.nan if v is None else v for v in vs])
            for k, vs in document["params"].items()}


def read_normalized(out: Path) -> tuple[list[str], list[str], np.ndarray]:
    with (out / "normalized.csv").open(newline="") as stream:
        header, *rows = list(csv.reader(stream))
    values = [[float(c) if c else np.nan for i, c in enumerate(r) if i != 1] for r in rows]
    return header, [r[1] for r in rows], np.array(values)


@pytest.mark.parametrize(("method", "privacy"),
                         [("zscore", "plain"), ("robust", "plain"), ("zscore", "mhe")])
def test_a_multi_host_run_fits_what_the_in_memory_simulation_fits(
    method: str, privacy: str, spawn: Callable[..., subprocess.Popen[bytes]], certs: Path,
    csvs: list[Path], tmp_path: Path,
) -> None:
    outs = [tmp_path / f"out-{role}" for role in range(4)]  # 0 is the server
    server, port = start_server(spawn, certs, method, outs[0],
                                "--privacy", privacy, "--preset", "test")
    parties = [start_party(spawn, port, p, csvs[p - 1], certs, outs[p],
                           timeout=60) for p in (1, 2, 3)]
    for proc in [server, *parties]:
        code, err = finish(proc, timeout=120)
        assert code == 0, err

    data = [load_party_data(path, "label") for path in csvs]
    expected = simulate([d.X for d in data], method, privacy,
                        FitOptions(preset="test")).normalizer
    # Plaintext runs are bit-for-bit reproducible; CKKS noise differs run to run, within
    # the PPF tolerance (1e-6 relative, see tests/test_ppf_zscore.py).
    rtol = 1e-12 if privacy == "plain" else 2e-6
    for out in outs:
        got = read_params(out)
        assert got.keys() == expected.params().keys()
        for name, values in expected.params().items():
            np.testing.assert_allclose(got[name], values, rtol=rtol, atol=0)
    for p in (1, 2, 3):
        header, labels, values = read_normalized(outs[p])
        assert header == HEADER
        assert labels == [row[1] for row in data[p - 1].rows]
        np.testing.assert_allclose(values, expected.transform(data[p - 1].X), rtol=1e-4,
                                   atol=1e-5 if privacy == "mhe" else 0)


class TerminalCapture:
    """A pseudo-terminal for a child's stderr, read by a thread into :attr:`data`."""

    def __init__(self) -> None:
        self.leader, self.follower = pty.openpty()
        self.data = bytearray()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.leader, 65536)
            except OSError:  # every writer has closed the terminal
                return
            if not chunk:
                return
            self.data += chunk

    def text(self) -> str:
        """Everything written, once the child has exited."""
        os.close(self.follower)
        self._thread.join(10)
        os.close(self.leader)
        return self.data.decode(errors="replace")


def test_a_session_of_several_methods_writes_each_method_s_files_apart(
    spawn: Callable[..., subprocess.Popen[bytes]], certs: Path, csvs: list[Path],
    tmp_path: Path,
) -> None:
    """``serve --method zscore,robust``: every role fits both in one session, and each
    --out gets a directory per method holding what a session of that method alone holds."""
    outs = [tmp_path / f"out-{role}" for role in range(4)]
    server, port = start_server(spawn, certs, "zscore,robust", outs[0])
    parties = [start_party(spawn, port, p, csvs[p - 1], certs, outs[p]) for p in (1, 2, 3)]
    for proc in [server, *parties]:
        code, err = finish(proc, timeout=120)
        assert code == 0, err
    data = [load_party_data(path, "label") for path in csvs]
    for method in ("zscore", "robust"):
        expected = simulate([d.X for d in data], method).normalizer
        for out in outs:
            assert sorted(p.name for p in out.iterdir()) == ["robust", "zscore"]
            got = read_params(out / method)
            for name, values in expected.params().items():
                np.testing.assert_allclose(got[name], values, rtol=1e-12, atol=0)
        for p in (1, 2, 3):
            _, _, values = read_normalized(outs[p] / method)
            np.testing.assert_allclose(values, expected.transform(data[p - 1].X), rtol=1e-12)


async def test_a_tcp_session_of_several_ppf_methods_generates_the_joint_keys_once(
    certs: Path,
) -> None:
    """Over TCP as in the simulation: one key-setup step (``keys-mhe``) first, then each
    protocol on those keys, its frames within its own ledger entry, no secret key sent."""
    spy, recorder = SecretKeySpy(), Recorder()
    options = FitOptions(algorithm="paper",
                         preset="test", vabs=(100.0,), minmax_bits=4, minmax_passes=2)
    slow = Timeouts(join=30.0, handshake=10.0, protocol=120.0)
    server = Server(ServerConfig("127.0.0.1", 0, parties=3, methods=("zscore", "minmax"),
                                 certs=certs, privacy="mhe", options=options, timeouts=slow),
                    tracer=recorder)
    arrays = party_arrays()
    runs: dict[int, PartyRun] = {}

    async def party(p: int, port: int) -> None:
        config = PartyConfig("127.0.0.1", port, p, certs, slow, allow_unflooded=True)
        runs[p] = await Party(config, tracer=spy).run(arrays[p - 1], FEATURES)

    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(server.serve)
        for p in (1, 2, 3):
            nursery.start_soon(party, p, port)
    outcome, secrets = server.outcomes[0], spy.secrets
    assert outcome.error is None, outcome.error
    pooled = np.vstack(arrays)
    zscore, minmax = outcome.normalizers
    np.testing.assert_allclose(zscore.mean, np.nanmean(pooled, axis=0), rtol=1e-5)
    np.testing.assert_allclose(minmax.min, np.nanmin(pooled, axis=0), atol=1e-2 * 100)
    for run in runs.values():
        assert run.plan.methods == ("zscore", "minmax")
        for mine, theirs in zip(run.normalizers, outcome.normalizers, strict=True):
            for name, values in theirs.params().items():
                np.testing.assert_allclose(mine.params()[name], values, rtol=1e-9)
    kinds = session_kinds(recorder, "paper")  # every frame within its step's ledger
    assert list(kinds) == ["keys-mhe", "zscore-mhe", "minmax-mhe"]  # in this order
    assert {"ckks.lead_keys", "ckks.relin_round2"} <= kinds["keys-mhe"]
    assert not (kinds["zscore-mhe"] | kinds["minmax-mhe"]) & KEY_SETUP_KINDS
    assert len(secrets) == 3
    assert not any(secret in frame for secret in secrets for frame in recorder.frames)


def test_serve_and_party_show_their_progress_on_a_terminal(
    spawn: Callable[..., subprocess.Popen[bytes]], certs: Path, csvs: list[Path],
    tmp_path: Path,
) -> None:
    terminals = {"server": TerminalCapture(), 1: TerminalCapture()}
    outs = [tmp_path / f"out-{role}" for role in range(4)]
    server, port = start_server(spawn, certs, "zscore", outs[0], "--privacy", "mhe",
                                "--preset", "test", stderr=terminals["server"].follower)
    parties = [start_party(spawn, port, p, csvs[p - 1], certs, outs[p], timeout=60,
                           stderr=terminals[1].follower if p == 1 else subprocess.PIPE)
               for p in (1, 2, 3)]
    errors = [finish(proc, timeout=120) for proc in [server, *parties]]
    assert all(code == 0 for code, _ in errors), errors
    shown = {role: terminal.text() for role, terminal in terminals.items()}
    for role, label in (("server", "fednorm serve"), (1, "fednorm party 1")):
        assert re.search(rf"{label}: key setup · round \d+ · [\d.]+ [kM]B sent", shown[role])
        assert "decryption" in shown[role]
    assert "fednorm serve: party 1 joined" in shown["server"]  # the log, above the line
    # A party whose stderr is no terminal shows no progress line.
    assert " sent, " not in errors[2][1] and "party 2: admitted" in errors[2][1]


@pytest.mark.parametrize("victim", ["party 1", "party 3", "server"])
@pytest.mark.parametrize("phase", ["plain-round2", "mhe-setup", "mhe-decrypt"])
def test_a_role_killed_mid_protocol_stops_everyone_with_one_cause_and_nothing_is_written(
    phase: str, victim: str, spawn: Callable[..., subprocess.Popen[bytes]], certs: Path,
    csvs: list[Path], tmp_path: Path,
) -> None:
    """Party 1 is the first the server reads, so when it is killed the others' frames
    still wait unread at the server; party 3 is the last; the server is the hub."""
    outs = [tmp_path / f"out-{role}" for role in range(4)]
    marker = tmp_path / "stalled"
    privacy = phase.split("-")[0]
    stalling = 1 if victim == "party 1" else 3
    # The paper's z-score: its key setup has the relinearization round to stall in.
    algorithm = ["--algorithm", "paper"] if privacy == "mhe" else []
    server, port = start_server(spawn, certs, "zscore", outs[0],
                                "--privacy", privacy, "--preset", "test", *algorithm)
    honest = [start_party(spawn, port, p, csvs[p - 1], certs, outs[p], timeout=60)
              for p in (1, 2, 3) if p != stalling]
    stalled = start_party(spawn, port, stalling, csvs[stalling - 1], certs, outs[stalling],
                          script=STALL_PARTY, timeout=60,
                          env={**os.environ, "FEDNORM_STALL_MARKER": str(marker),
                               "FEDNORM_STALL_AT": phase})
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline and stalled.poll() is None, finish(stalled)
        time.sleep(0.02)
    # SIGKILL, inside the chosen phase: the stalled party, or the server waiting for it.
    (server if victim == "server" else stalled).kill()

    killed = time.monotonic()
    survivors = honest if victim == "server" else [server, *honest]
    results = [finish(proc, timeout=45) for proc in survivors]
    # Well before the 60 s protocol timeout: the dropout is seen, not waited out.
    assert time.monotonic() - killed < 30
    assert all(code == 1 for code, _ in results), results
    # The server names the cause; each party reports that same text (through the
    # server's Abort), not a broken pipe of its own.  A party that loses the server
    # says so.
    cause = ("server dropped: connection" if victim == "server" else
             re.search(rf"failed: PartyDropped: ({victim} dropped: .*)", results[0][1])[1])
    assert_one_cause(results, cause)
    assert nothing_written(outs)


@pytest.mark.parametrize("victim", ["party 3", "server"])
def test_a_role_killed_while_waiting_for_the_start_leaves_one_cause(
    victim: str, spawn: Callable[..., subprocess.Popen[bytes]], certs: Path,
    csvs: list[Path], tmp_path: Path,
) -> None:
    outs = [tmp_path / f"out-{role}" for role in range(4)]
    server, port = start_server(spawn, certs, "zscore", outs[0], "--join-timeout", 6)
    waiting = {p: start_party(spawn, port, p, csvs[p - 1], certs, outs[p]) for p in (1, 3)}
    # Both are admitted and wait for party 2, who never comes.
    said = {p: read_until(proc, "waiting for the start") for p, proc in waiting.items()}
    (waiting.pop(3) if victim == "party 3" else server).kill()
    survivors = {0: server, **waiting} if victim == "party 3" else waiting
    results = [(code, said.get(role, "") + err)
               for role, (code, err) in ((r, finish(p)) for r, p in survivors.items())]
    assert all(code == 1 for code, _ in results), results
    # A party that left the lobby frees its slot, so the session fails for lack of it.
    cause = ("party 2, party 3 dropped: did not join within 6 s" if victim == "party 3"
             else "server dropped: connection")
    assert_one_cause(results, cause)
    assert nothing_written(outs)


# Each case: the server's extra options, party 3's data, whether party 3 joins first,
# and the cause every role must print (party 3's own error may be an exit 2).
COLUMNS = ["a", "label", "b", "c", "d"]
SCHEMA_CASES = {
    "misfit joins first": ([], "extra column", True,
                           "party 3's columns differ from the federation's: has unexpected "
                           "'d'"),
    "misfit joins last": ([], "extra column", False,
                          "party 3's columns differ from the federation's: has unexpected 'd'"),
    "schema configured": (["--features", "a,b,c"], "extra column", True,
                          "party 3's columns differ from the federation's: has unexpected "
                          "'d'"),
    "V_abs count": (["--method", "minmax", "--privacy", "mhe",
                     "--algorithm", "paper", "--vabs", "100,100"], "fits",
                    False, "--vabs has 2 bounds for 3 features (a, b, c)"),
    # The cause names the category only: which feature and how large a value stays
    # with party 3 (checked below), as the ledger lists no such detail.
    "beyond V_abs": (["--method", "minmax", "--privacy", "mhe",
                     "--algorithm", "paper", "--vabs", "100"],
                     "beyond", False, "party 3 refused its input: values beyond the agreed "
                     "V_abs; agree on a larger V_abs (vabs), one that bounds every party's "
                     "values"),
    # A party that cannot read its own data never joins: it connects only to say so.
    "unusable data, others waiting": ([], "not numeric", False,
                                      "party 3 refused its input: its data cannot be used; "
                                      "fix its data: that party's own log names the columns "
                                      "and the cause"),
    "unusable data, first": ([], "not numeric", True,
                             "party 3 refused its input: its data cannot be used"),
    # Keys declared for fewer flooded decryptions than the session makes: refused before
    # any key (each party checks on its own columns, the server once it knows them).
    "too few decryptions": (["--privacy", "mhe", "--flooding-decryptions", "1"], "fits",
                            False, "this session makes up to 2 flooded decryptions on 3 "
                            "features (zscore-mhe 2 coefficient sums), more than keys "
                            "declared for τ = 1 serve: declare at least τ = 2"),
    # Party 3 was not started with --allow-paper-algorithms: it withdraws before any key.
    "paper algorithms not allowed": (["--privacy", "mhe", "--algorithm", "paper"],
                                     "distrustful", False,
                                     "party 3 refused the session: zscore-mhe with "
                                     "--algorithm paper decrypts without a proven "
                                     "flooding bound (docs/LEAKAGE.md)"),
}


@pytest.mark.parametrize("case", list(SCHEMA_CASES))
def test_a_session_that_cannot_run_stops_every_role_at_once_with_one_cause(
    case: str, spawn: Callable[..., subprocess.Popen[bytes]], certs: Path,
    csvs: list[Path], tmp_path: Path,
) -> None:
    extra, data, first, cause = SCHEMA_CASES[case]
    third = {"extra column": lambda: write_rows(tmp_path / "p3.csv", COLUMNS,
                                                [[1, "yes", 2, 3, 4], [2, "no", 3, 4, 5]]),
             "beyond": lambda: write_rows(tmp_path / "p3.csv", HEADER,
                                          [[1, "yes", 5000, 3], [2, "no", 3, 4]]),
             "fits": lambda: csvs[2],
             "distrustful": lambda: csvs[2],
             "not numeric": lambda: write_rows(tmp_path / "p3.csv", HEADER,
                                               [[1, "yes", "x", 3], [2, "no", 3, 4]])}[data]()
    outs = [tmp_path / f"out-{role}" for role in range(4)]
    server, port = start_server(spawn, certs, "zscore", outs[0], "--preset", "test",
                                "--join-timeout", 60, *extra)
    started = time.monotonic()
    parties, said = {}, ""
    if first:
        parties[3] = start_party(spawn, port, 3, third, certs, outs[3])
        said = read_until(parties[3], "fednorm")  # party 3 is in or refused (it said so)
    for p in (1, 2):
        parties[p] = start_party(spawn, port, p, csvs[p - 1], certs, outs[p])
    if not first:
        time.sleep(1.5)
        parties[3] = start_party(spawn, port, 3, third, certs, outs[3],
                                 trusting=data != "distrustful")
    results = [finish(proc) for proc in [server, *parties.values()]]
    if first:  # what party 3 said while the others were not there yet
        results[1] = (results[1][0], said + results[1][1])
    assert time.monotonic() - started < 30  # not the 60 s join timeout
    assert results[0][0] == 1, results[0]
    assert_one_cause(results, cause)
    if data == "distrustful":  # its own configuration refused the session: exit 2
        assert results[-1][0] == 2, results[-1]
    details = {"beyond": "'b' (|x| up to 5000, bound 100)", "not numeric": "'x'"}
    if data in details:  # the detail only on party 3's own console, which exits 2
        third_at = 1 if first else len(results) - 1
        assert results[third_at][0] == 2 and details[data] in results[third_at][1]
        assert all(details[data] not in err
                   for role, (_, err) in enumerate(results) if role != third_at)
    assert nothing_written(outs)


def test_each_session_writes_its_own_directory_and_the_exit_status_tells_which_failed(
    spawn: Callable[..., subprocess.Popen[bytes]], certs: Path, csvs: list[Path],
    tmp_path: Path,
) -> None:
    outs = [tmp_path / f"out-{role}" for role in range(4)]
    server, port = start_server(spawn, certs, "zscore", outs[0], "--sessions", 2)
    first = [start_party(spawn, port, p, csvs[p - 1], certs, outs[p]) for p in (1, 2, 3)]
    assert all(finish(proc)[0] == 0 for proc in first)
    written = {p: (outs[p] / "params.json").read_bytes() for p in (1, 2, 3)}
    # The parties' --out now holds a result: a second run refuses it without --force.
    refused = start_party(spawn, port, 1, csvs[0], certs, outs[1])
    code, err = finish(refused)
    assert code == 2 and "is not empty" in err, err
    other = write_rows(tmp_path / "p3.csv", COLUMNS, [[1, "yes", 2, 3, 4]])
    second = [start_party(spawn, port, p, csvs[p - 1] if p < 3 else other, certs, outs[p],
                          "--force") for p in (1, 2, 3)]
    assert all(finish(proc)[0] == 1 for proc in second)
    stdout, stderr = server.communicate(timeout=30)

    assert server.returncode == 3, stderr  # one session done, one failed
    lines = stdout.decode().splitlines()  # start_server read "listening on ..."
    assert re.fullmatch(r"session 1 \(\w+\): done in [\d.]+ s; wrote .*session-1/params.json",
                        lines[0]), lines
    assert re.fullmatch(r"session 2 \(\w+\): failed: party 3's columns differ .*'d'",
                        lines[1]), lines
    assert read_params(outs[0] / "session-1").keys() == {"mean", "var"}
    assert not (outs[0] / "session-2").exists()
    # The failed session wrote nothing: the first run's files are as they were.
    assert all((outs[p] / "params.json").read_bytes() == written[p] for p in (1, 2, 3))
