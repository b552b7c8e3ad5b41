"""A multi-host server (fednorm.multihost.server) live in this process, as if on another
host, against garbage, misplaced frames, unknown, duplicate and foreign parties and a fit
that overflows: the session fails with its cause, and the next one completes."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import trio
from federation_processes import FEATURES, party_arrays
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fednorm.cli import main
from fednorm.engine.codec import WIRE_VERSION, Header, decode_frame, encode_frame
from fednorm.engine.errors import FednormError, InputError, PartyDropped, ProtocolError
from fednorm.multihost.config import PartyConfig, ServerConfig, Timeouts
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
from fednorm.protocols.base import feature_counts
from fednorm.protocols.plain.zscore import LocalSums
from fednorm.transport.tcp import HandshakeRefused
from fednorm.transport.tls import init_certs, party_context

FAST = Timeouts(join=5.0, handshake=2.0, protocol=5.0)


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
