"""Multi-host runs over loopback: real processes, a fuzzed live server, and CLI input checks."""

from __future__ import annotations

import csv
import json
import os
import pty
import re
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recording import KEY_SETUP_KINDS, Recorder, session_kinds, spy_secret_keys

from fednorm.cli import main
from fednorm.engine.codec import WIRE_VERSION, Header, decode_frame, encode_frame
from fednorm.engine.errors import FednormError, InputError, PartyDropped, ProtocolError
from fednorm.multihost.config import PartyConfig, ServerConfig, Timeouts
from fednorm.multihost.files import check_out_dir, load_party_data, write_atomically
from fednorm.multihost.handshake import (
    HANDSHAKE_MAX_FRAME,
    NET_VERSION,
    Hello,
    Ready,
    Refusal,
    connect_party,
    decode_handshake,
    encode_handshake,
    send_handshake,
    wait_start,
)
from fednorm.multihost.party import Party, PartyRun
from fednorm.multihost.server import Server
from fednorm.protocols import FitOptions
from fednorm.protocols.base import feature_counts
from fednorm.protocols.plain.zscore import LocalSums
from fednorm.sim.federation import simulate
from fednorm.transport.tcp import HandshakeRefused
from fednorm.transport.tls import init_certs, party_context

FAST = Timeouts(join=5.0, handshake=2.0, protocol=5.0)


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
    certs: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over TCP as in the simulation: one key-setup step (``keys-mhe``) first, then each
    protocol on those keys, its frames within its own ledger entry, no secret key sent."""
    secrets = spy_secret_keys(monkeypatch)
    recorder = Recorder()
    options = FitOptions(algorithm="paper",
                         preset="test", vabs=(100.0,), minmax_bits=4, minmax_passes=2)
    slow = Timeouts(join=30.0, handshake=10.0, protocol=120.0)
    server = Server(ServerConfig("127.0.0.1", 0, parties=3, methods=("zscore", "minmax"),
                                 certs=certs, privacy="mhe", options=options, timeouts=slow),
                    tracer=recorder)
    arrays = party_arrays()
    runs: dict[int, PartyRun] = {}

    async def party(p: int, port: int) -> None:
        config = PartyConfig("127.0.0.1", port, p, certs, slow, allow_unchecked=True)
        runs[p] = await Party(config).run(arrays[p - 1], FEATURES)

    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(server.serve)
        for p in (1, 2, 3):
            nursery.start_soon(party, p, port)
    outcome = server.outcomes[0]
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
                     "V_abs"),
    # A party that cannot read its own data never joins: it connects only to say so.
    "unusable data, others waiting": ([], "not numeric", False,
                                      "party 3 refused its input: its data cannot be used"),
    "unusable data, first": ([], "not numeric", True,
                             "party 3 refused its input: its data cannot be used"),
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
        parties[3] = start_party(spawn, port, 3, third, certs, outs[3])
    results = [finish(proc) for proc in [server, *parties.values()]]
    if first:  # what party 3 said while the others were not there yet
        results[1] = (results[1][0], said + results[1][1])
    assert time.monotonic() - started < 30  # not the 60 s join timeout
    assert results[0][0] == 1, results[0]
    assert_one_cause(results, cause)
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


# -- a live server in this process ------------------------------------------------------
class LiveServer:
    """A :class:`Server` in its own thread and trio loop, as if on another host."""

    def __init__(self, certs: Path, parties: int = 2) -> None:
        config = ServerConfig("127.0.0.1", 0, parties=parties, methods=("zscore",), certs=certs,
                              timeouts=FAST, sessions=None)
        self.log: list[str] = []
        self.server = Server(config, log=self.log.append)
        self.certs = certs
        self._ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as self._scope:
            async with trio.open_nursery() as nursery:
                _, self.port = await nursery.start(self.server.serve)
                self._ready.set()

    def __enter__(self) -> LiveServer:
        self._thread.start()
        assert self._ready.wait(10), "the live server did not start"
        return self

    def __exit__(self, *exc_info: object) -> None:
        trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(10)

    def wait(self, condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"no {what}; server log: {self.log[-5:]}"
            time.sleep(0.01)

    async def wait_log(self, text: str, since: int) -> None:
        with trio.fail_after(10):
            while not any(text in line for line in self.log[since:]):
                await trio.sleep(0.01)

    async def party(self, party: int, X: np.ndarray, results: dict[int, object]) -> None:
        """An honest party; its result or error lands in ``results``."""
        config = PartyConfig("127.0.0.1", self.port, party, self.certs, FAST)
        try:
            results[party] = await Party(config).run(X, FEATURES)
        except FednormError as exc:
            results[party] = exc

    def session(self, arrays: list[np.ndarray]) -> dict[int, object]:
        """One session of honest parties with these arrays; each party's result or error,
        once the server has recorded the session's outcome."""
        async def run() -> dict[int, object]:
            results: dict[int, object] = {}
            async with trio.open_nursery() as nursery:
                for party, X in enumerate(arrays, start=1):
                    nursery.start_soon(self.party, party, X, results)
            return results

        sessions = len(self.server.outcomes)
        results = trio.run(run)
        self.wait(lambda: len(self.server.outcomes) > sessions, "session outcome")
        return results

    def honest_session(self, arrays: list[np.ndarray]) -> dict[int, object]:
        results = self.session(arrays)
        assert all(isinstance(r, PartyRun) for r in results.values()), results
        assert self.server.outcomes[-1].error is None, self.server.outcomes[-1]
        return results


ARRAYS = party_arrays(sizes=(12, 9))


@pytest.fixture(scope="module")
def live(certs: Path) -> Iterator[LiveServer]:
    with LiveServer(certs) as server:
        server.honest_session(ARRAYS)  # so that there is an earlier session to replay
        yield server


def hello_for(party: int) -> Hello:
    return Hello(NET_VERSION, WIRE_VERSION, party, tuple(FEATURES))


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


VALID_HELLO = encode_handshake(hello_for(1))
GARBAGE = st.one_of(
    st.tuples(st.just("frame"), st.binary(max_size=200)),  # random bytes in a frame
    st.tuples(st.just("raw"), st.binary(max_size=200)),  # random bytes, no framing
    st.tuples(st.just("oversized"), st.integers(HANDSHAKE_MAX_FRAME + 1, 2**32 - 1)),
    st.tuples(st.just("truncated"), st.integers(0, len(VALID_HELLO) - 1)),  # cut body
    st.tuples(st.just("cut"), st.integers(0, len(VALID_HELLO) - 1)),  # stream ends mid-frame
    st.tuples(st.just("plaintext"), st.binary(min_size=1, max_size=200)),  # no TLS at all
)


async def send_garbage(port: int, certs: Path, kind: str, value: object) -> bytes:
    """Send one kind of garbage as (TLS-authenticated) party 1; return what came back."""
    stream: trio.abc.Stream = await trio.open_tcp_stream("127.0.0.1", port)
    if kind != "plaintext":
        stream = trio.SSLStream(stream, party_context(certs, 1), server_hostname="127.0.0.1")
        await stream.do_handshake()
    payload = {
        "frame": lambda: frame(value), "raw": lambda: value, "plaintext": lambda: value,
        "oversized": lambda: struct.pack(">I", value),
        "truncated": lambda: frame(VALID_HELLO[:value]),
        "cut": lambda: struct.pack(">I", len(VALID_HELLO)) + VALID_HELLO[:value],
    }[kind]()
    received = b""
    with trio.fail_after(5):
        try:
            await stream.send_all(payload)
            if kind in ("raw", "cut", "plaintext"):  # the server waits for more: end it
                await stream.aclose()
            while chunk := await stream.receive_some():
                received += chunk
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await stream.aclose()
    return received


@settings(max_examples=18, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbage=GARBAGE)
def test_garbage_is_refused_and_the_server_completes_the_next_session(
    live: LiveServer, garbage: tuple[str, object]
) -> None:
    kind, value = garbage
    refused = len(live.server.rejections)
    reply = trio.run(send_garbage, live.port, live.certs, kind, value)
    live.wait(lambda: len(live.server.rejections) > refused, "rejection")
    error = live.server.rejections[-1].error
    if kind in ("frame", "oversized", "truncated", "plaintext"):
        assert isinstance(error, ProtocolError), error
    else:
        assert isinstance(error, ProtocolError | PartyDropped), error
    if kind in ("frame", "oversized", "truncated"):  # the client is told why
        refusal = decode_handshake(reply[4:], Refusal)
        assert refusal.reason == str(error)
    live.honest_session(ARRAYS)


MISPLACED = st.one_of(
    st.tuples(st.just("session"), st.text(max_size=20)),
    st.tuples(st.just("round"), st.integers(1, 2**31)),
    st.tuples(st.just("sender"), st.integers(-3, 50).filter(lambda s: s != 1)),
    st.tuples(st.just("replay"), st.none()),  # party 1's first frame of an earlier session
)
MISPLACED_REASON = {"session": "belongs to session", "replay": "belongs to session",
                    "round": "has round", "sender": "claims sender"}


async def misbehave(live: LiveServer, kind: str, value: object, earlier: str) -> object:
    """Join as party 1, then send a well-formed first frame with one header field wrong."""
    link, welcome = await connect_party(
        "127.0.0.1", live.port, party_context(live.certs, 1), hello_for(1),
        connect_timeout=5, handshake_timeout=5)
    await send_handshake(link, Ready(welcome.session))
    await wait_start(link, welcome.session, 5)
    session = {"session": f"{value}~", "replay": earlier}.get(kind, welcome.session)
    header = Header("zscore-plain", session, value if kind == "round" else 0,
                    value if kind == "sender" else 1, LocalSums.KIND)
    X = ARRAYS[0]
    await link.send(encode_frame(header, LocalSums(count=feature_counts(X),
                                                   total=np.nansum(X, axis=0))))
    _, reply = decode_frame(await link.receive())  # the server's Abort
    await link.aclose()
    return reply


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(misplaced=MISPLACED)
def test_misplaced_frames_fail_the_session_and_the_server_completes_the_next(
    live: LiveServer, misplaced: tuple[str, object]
) -> None:
    kind, value = misplaced
    sessions, earlier = len(live.server.outcomes), live.server.outcomes[-1].session

    async def run() -> tuple[object, dict[int, object]]:
        results: dict[int, object] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(live.party, 2, ARRAYS[1], results)
            reply = await misbehave(live, kind, value, earlier)
        return reply, results

    abort, results = trio.run(run)
    live.wait(lambda: len(live.server.outcomes) > sessions, "session outcome")
    error = live.server.outcomes[-1].error
    assert isinstance(error, ProtocolError) and MISPLACED_REASON[kind] in str(error), error
    assert getattr(abort, "reason", None) == str(error)
    assert isinstance(results[2], PartyDropped) and str(error) in str(results[2])
    live.honest_session(ARRAYS)


def test_unknown_duplicate_and_foreign_parties_are_refused_while_a_session_completes(
    live: LiveServer, tmp_path: Path
) -> None:
    foreign = tmp_path / "foreign"
    init_certs(foreign, parties=2)
    (foreign / "ca.pem").write_bytes((live.certs / "ca.pem").read_bytes())  # trusts us

    async def refusal(directory: Path, party: int) -> str:
        with pytest.raises(HandshakeRefused) as refused:
            await connect_party("127.0.0.1", live.port, party_context(directory, party),
                                hello_for(party), connect_timeout=5, handshake_timeout=5)
        return str(refused.value)

    async def run() -> tuple[list[str], dict[int, object]]:
        results: dict[int, object] = {}
        since = len(live.log)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(live.party, 1, ARRAYS[0], results)
            await live.wait_log("party 1 joined", since)
            reasons = [await refusal(live.certs, 1), await refusal(live.certs, 3),
                       await refusal(foreign, 2)]
            nursery.start_soon(live.party, 2, ARRAYS[1], results)
        return reasons, results

    sessions = len(live.server.outcomes)
    (duplicate, unknown, other_ca), results = trio.run(run)
    assert "party 1 is already connected" in duplicate
    assert "party 3 is not expected: parties are 1..2" in unknown
    assert "server refused the certificate this end presented: it was not issued by the " \
           "CA the peer trusts" in other_ca, other_ca
    assert all(isinstance(r, PartyRun) for r in results.values()), results
    live.wait(lambda: len(live.server.outcomes) > sessions, "session outcome")
    assert live.server.outcomes[-1].error is None


@pytest.mark.filterwarnings("error::RuntimeWarning")  # the error, not numpy's warnings
def test_a_fit_that_overflows_is_the_same_error_on_every_role_not_null_parameters(
    live: LiveServer,
) -> None:
    huge = [X.copy() for X in ARRAYS]
    huge[0][:, 0] = 1e300 * np.sign(huge[0][:, 0])  # squares overflow float64
    results = live.session(huge)
    cause = "the zscore fit overflows float64 for 'a'"
    assert cause in str(live.server.outcomes[-1].error)
    assert all(isinstance(r, InputError) and cause in str(r) for r in results.values()), results
    live.honest_session(ARRAYS)


def test_a_refused_party_exits_1_with_the_cause_and_writes_nothing(
    live: LiveServer, csvs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["party", "--connect", f"127.0.0.1:{live.port}", "--id", "3", "--data",
                 str(csvs[2]), "--target", "label", "--certs", str(live.certs),
                 "--out", str(tmp_path / "out")])
    assert code == 1
    assert "party 3 is not expected" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# -- input checks -----------------------------------------------------------------------
@pytest.fixture
def bad_inputs(tmp_path: Path) -> dict[str, Path]:
    text = tmp_path / "text.csv"
    text.write_text("a,label,b\n1,yes,2\nx,no,3\n")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage\x80\n")
    afile = tmp_path / "a-file"
    afile.write_text("")
    (tmp_path / "empty").mkdir()
    (tmp_path / "nonempty").mkdir()
    (tmp_path / "nonempty" / "params.json").write_text("{}")
    return {"TEXT": text, "BINARY": binary, "FILE": afile, "EMPTY": tmp_path / "empty",
            "MISSING": tmp_path / "missing.csv", "NONEMPTY": tmp_path / "nonempty",
            "UNWRITABLE": Path("/proc/fednorm-out")}  # even root cannot create files there


PARTY = ["party", "--connect", "127.0.0.1:9", "--id", "1", "--data", "DATA", "--target",
         "label", "--certs", "CERTS", "--out", "OUT", "--join-timeout", "30"]
SERVE = ["serve", "--bind", "127.0.0.1:0", "--parties", "3", "--method", "zscore",
         "--certs", "CERTS", "--join-timeout", "30"]


def edit(base: list[str], **changes: str) -> list[str]:
    args = list(base)
    for flag, value in changes.items():
        args[args.index("--" + flag.replace("_", "-")) + 1] = value
    return args


@pytest.mark.parametrize("args, message", [
    (edit(PARTY, data="MISSING"), "is not a file"),
    (edit(PARTY, data="BINARY"), "cannot read"),
    (edit(PARTY, data="TEXT"), "non-numeric value 'x'"),
    (edit(PARTY, target="outcome"), "target 'outcome' is not a column"),
    (edit(PARTY, id="0"), r"party ids are 1\.\.N"),
    (edit(PARTY, id="9"), "no party 9 certificate"),
    (edit(PARTY, certs="EMPTY"), "not a certs directory"),
    (edit(PARTY, connect="localhost"), "HOST:PORT"),
    (edit(PARTY, out="FILE"), "not a directory"),
    (edit(SERVE, parties="0"), "at least 1"),
    (edit(SERVE, certs="EMPTY"), "not a certs directory"),
    (edit(SERVE, bind="0.0.0.0"), "HOST:PORT"),
    (edit(SERVE, join_timeout="0"), "timeout must be positive"),
    (edit(SERVE, method="zscroe"), "got 'zscroe'"),
    ([*SERVE, "--sessions", "0"], "at least 1"),
    (edit(PARTY, out="UNWRITABLE"), "is not writable"),
    ([*SERVE, "--out", "UNWRITABLE"], "is not writable"),
    (edit(PARTY, out="NONEMPTY"), "is not empty.*--force"),
    ([*SERVE, "--out", "NONEMPTY"], "is not empty.*--force"),
    ([*edit(SERVE, method="minmax"), "--privacy", "mhe",
      "--algorithm", "paper"], "minmax-mhe needs --vabs"),
    ([*edit(SERVE, method="robust"), "--privacy", "mhe",
      "--algorithm", "paper"], "robust-mhe needs --vabs"),
    ([*edit(SERVE, method="minmax"), "--privacy", "mhe", "--algorithm", "paper",
      "--features", "a,b", "--vabs", "1,2,3"], r"3 bounds for 2 features \(a, b\)"),
    ([*SERVE, "--features", "a,,b"], "non-empty names"),
    ([*SERVE, "--epsilon", "inf"], "epsilon must be a finite"),
    ([*SERVE, "--vabs", "-1"], "vabs bounds must be finite positive"),
    ([*SERVE, "--vabs", "10"], "--vabs bounds .* this run would ignore it"),
])
def test_bad_input_exits_2_before_connecting(
    args: list[str], message: str, certs: Path, csvs: list[Path], tmp_path: Path,
    bad_inputs: dict[str, Path], capsys: pytest.CaptureFixture[str],
) -> None:
    names = {"DATA": csvs[0], "CERTS": certs, "OUT": tmp_path / "out", **bad_inputs}
    argv = [str(names.get(a, a)) for a in args]
    started = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    assert code == 2
    assert re.search(message, capsys.readouterr().err)
    assert time.monotonic() - started < 5  # it did not try to connect
    assert not (tmp_path / "out").exists()


def test_a_party_refuses_complex_data_before_connecting(certs: Path) -> None:
    party = Party(PartyConfig("127.0.0.1", 9, 1, certs, FAST))
    X = np.array([[1 + 1j, 2, 3], [4, 5, 6]])
    with pytest.raises(InputError, match="complex"):
        trio.run(party.run, X, FEATURES)


def test_an_output_probe_leaves_no_directory_behind(tmp_path: Path) -> None:
    check_out_dir(tmp_path / "new" / "deeper")
    assert list(tmp_path.iterdir()) == []


def test_outputs_are_all_or_nothing(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("a file where a directory should be")
    with pytest.raises(FednormError, match="cannot write outputs"):
        write_atomically({tmp_path / "first.json": b"{}",
                          tmp_path / "blocker" / "second.csv": b""})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]


async def test_a_party_s_rejected_input_reaches_its_peers_as_a_category_only() -> None:
    """The abort a party sends names the category, never the data-dependent detail (how
    many values, which feature); its own console gets both."""
    from fednorm.engine.errors import InputError
    from fednorm.session import run_role

    sent: list[str] = []

    class Peerless:
        me = 2

        async def send_abort(self, reason: str) -> None:
            sent.append(reason)

    async def refusing() -> None:
        raise InputError("this party holds 700 values of feature 'age'")

    with pytest.raises(InputError) as refused:
        await run_role(Peerless(), refusing())
    assert sent == ["party 2 refused its input"]
    assert str(refused.value) == ("party 2 refused its input: this party holds 700 values "
                                  "of feature 'age'")
