"""The engine: codec, frame checks, timeouts, and structured failure of a federation."""

from __future__ import annotations

import contextlib
import threading
import time

import msgpack
import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fednorm.engine.codec import Header, decode_frame, encode_frame, register_ext_type
from fednorm.engine.errors import (
    FednormError,
    InputError,
    PartyDropped,
    ProtocolError,
    ProtocolTimeout,
    RunAborted,
)
from fednorm.engine.messages import Message, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols import get_protocol
from fednorm.protocols.plain.zscore import LocalSums
from fednorm.sim.federation import run_federation
from fednorm.transport.memory import link_pair


@message("test.payload")
class Payload(Message):
    values: np.ndarray
    note: str


@message("test.other")
class Other(Message):
    n: int


HEADER = Header("proto", "session-1", 0, 1, "test.payload")


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(st.sampled_from([np.float64, np.int64, np.uint8, np.bool_]),
                  hnp.array_shapes(min_dims=0, max_dims=3, min_side=0)), st.text())
def test_frames_round_trip_numpy_arrays(values: np.ndarray, note: str) -> None:
    header, msg = decode_frame(encode_frame(HEADER, Payload(values=values, note=note)))
    assert header == HEADER
    assert msg.values.dtype == values.dtype and msg.values.shape == values.shape
    np.testing.assert_array_equal(msg.values, values)
    assert msg.note == note


def test_the_body_of_a_frame_larger_than_msgpacks_buffer_is_found() -> None:
    """A frame's body is found past its header without feeding the whole frame to an
    unpacker, whose buffer holds 100 MiB: a relay of 30 input uploads at the paper
    preset is larger."""
    from fednorm.engine.codec import encode_body, frame_body

    payload = Payload(values=np.zeros(14 * 2**20), note="")  # 112 MiB
    assert frame_body(encode_frame(HEADER, payload)) == encode_body(payload)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_are_protocol_errors(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_frame(data)


def _raw_frame(kind: str, body: dict, version: int = 1) -> bytes:
    return msgpack.packb([version, "proto", "s", 0, 1, kind, body])


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (_raw_frame("no.such.kind", {}), "unknown message kind"),
        (_raw_frame("test.other", {"n": 1, "extra": 2}), "unexpected"),
        (_raw_frame("test.other", {}), "missing"),
        (_raw_frame("test.other", {"n": 1}, version=99), "wire version"),
        (msgpack.packb([1, 2, 3]), "7-element"),
        (encode_frame(HEADER, Payload(values=np.ones(4), note=""))[:-5], "undecodable"),
        (msgpack.packb([1, "p", "s", 0, 1, "test.payload",
                        {"values": msgpack.ExtType(1, b"\x01\x02"), "note": ""}]), "numpy"),
        (msgpack.packb([1, "p", "s", 0, 1, "test.other", {"n": msgpack.ExtType(99, b"")}]),
         "ext type"),
    ],
)
def test_malformed_frames_are_rejected(frame: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_frame(frame)


def test_object_arrays_cannot_be_sent() -> None:
    with pytest.raises(TypeError):
        encode_frame(HEADER, Payload(values=np.array([object()]), note=""))


def _pair(timeout: float | None = 5.0) -> tuple[RoleContext, RoleContext, object]:
    server_end, party_end = link_pair(SERVER, 1)
    server = RoleContext(SERVER, {1: server_end}, "s1", protocol="proto", timeout=timeout)
    party = RoleContext(1, {SERVER: party_end}, "s1", protocol="proto", timeout=timeout)
    return server, party, party_end


async def test_messages_flow_and_bytes_are_counted() -> None:
    server, party, _ = _pair()
    await party.send(SERVER, Other(n=7))
    assert (await server.receive(1, Other)).n == 7
    assert party.stats.bytes_sent == server.stats.bytes_received > 0


async def test_a_broadcast_is_one_frame_object_for_every_party_at_the_same_round() -> None:
    """In one process a broadcast to P parties waits in their links as one copy; the
    bytes counted per link are still the frame's own."""
    links = {p: link_pair(SERVER, p) for p in (1, 2, 3)}
    server = RoleContext(SERVER, {p: ends[0] for p, ends in links.items()}, "s1",
                         protocol="proto", timeout=5.0)
    await server.send(3, Other(n=0))  # party 3 is one round ahead of the others
    await server.broadcast(Payload(values=np.arange(1000.0), note="all"))
    frames = {}
    for party, (_, party_end) in links.items():
        if party == 3:
            await party_end.receive()  # the message before the broadcast
        frames[party] = await party_end.receive()
    assert frames[1] is frames[2] and frames[3] is not frames[1]  # its header differs
    assert decode_frame(frames[3])[0].round == 1 and decode_frame(frames[1])[0].round == 0
    assert server.stats.bytes_sent == sum(len(f) for f in frames.values()) + len(
        encode_frame(Header("proto", "s1", 0, SERVER, "test.other"), Other(n=0)))


async def test_wrong_kind_is_a_protocol_error() -> None:
    server, party, _ = _pair()
    await party.send(SERVER, Other(n=7))
    with pytest.raises(ProtocolError, match=r"expected 'test\.payload'"):
        await server.receive(1, Payload)


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (Header("proto", "other-session", 0, 1, "test.other"), "session"),
        (Header("proto", "s1", 0, 2, "test.other"), "claims sender"),
        (Header("proto", "s1", 5, 1, "test.other"), "out of order"),
        (Header("proto/kth", "s1", 0, 1, "test.other"), "for protocol"),
    ],
)
async def test_misplaced_frames_are_protocol_errors(header: Header, match: str) -> None:
    server, _, party_end = _pair()
    await party_end.send(encode_frame(header, Other(n=1)))
    with pytest.raises(ProtocolError, match=match):
        await server.receive(1, Other)


async def test_replayed_frame_is_rejected() -> None:
    server, _, party_end = _pair()
    frame = encode_frame(Header("proto", "s1", 0, 1, "test.other"), Other(n=1))
    await party_end.send(frame)
    await party_end.send(frame)
    await server.receive(1, Other)
    with pytest.raises(ProtocolError, match="replayed"):
        await server.receive(1, Other)


async def test_silent_peer_times_out() -> None:
    server, _, _ = _pair(timeout=0.05)
    with pytest.raises(ProtocolTimeout, match="party 1"):
        await server.receive(1, Other)


async def test_closed_link_is_a_dropout() -> None:
    server, _, party_end = _pair()
    await party_end.aclose()
    with pytest.raises(PartyDropped, match="party 1"):
        await server.receive(1, Other)


async def test_abort_from_peer_stops_the_receiver() -> None:
    server, party, _ = _pair()
    await party.send_abort("disk full")
    with pytest.raises(RunAborted, match=r"^party 1 stopped the run: disk full$"):
        await server.receive(1, Other)


class SlowToParse:
    """A payload whose parse takes a while and records how many ran at once."""

    lock = threading.Lock()
    running = 0
    most_at_once = 0

    def __init__(self, data: bytes) -> None:
        self.data = data

    @classmethod
    def parse(cls, data: bytes) -> SlowToParse:
        with cls.lock:
            cls.running += 1
            cls.most_at_once = max(cls.most_at_once, cls.running)
        time.sleep(0.1)
        with cls.lock:
            cls.running -= 1
        if data.startswith(b"bad"):
            raise ValueError("hostile payload")
        return cls(data)


register_ext_type(90, SlowToParse, lambda obj: obj.data, SlowToParse.parse)


@message("test.slow")
class Slow(Message):
    payload: SlowToParse


def _gathering_server(parties: int, timeout: float = 5.0) -> tuple[RoleContext, dict]:
    links = {p: link_pair(SERVER, p) for p in range(1, parties + 1)}
    server = RoleContext(SERVER, {p: ends[0] for p, ends in links.items()}, "s1",
                         protocol="proto", timeout=timeout,
                         worker_limiter=trio.CapacityLimiter(2))
    parties_ = {p: RoleContext(p, {SERVER: ends[1]}, "s1", protocol="proto", timeout=timeout)
                for p, ends in links.items()}
    return server, parties_


async def test_gather_parses_the_parties_frames_side_by_side() -> None:
    """A round's large frames are parsed in worker threads as they are read, two at a
    time here (the limiter's capacity), not one after another."""
    server, parties = _gathering_server(4)
    SlowToParse.most_at_once = 0
    for p, ctx in parties.items():
        await ctx.send(SERVER, Slow(payload=SlowToParse(bytes([p]) * 100_000)))
    replies = await server.gather(Slow)
    assert [replies[p].payload.data[:1] for p in (1, 2, 3, 4)] == [b"\1", b"\2", b"\3", b"\4"]
    assert SlowToParse.most_at_once == 2
    assert server.stats.rounds == 1


async def test_gather_raises_the_lowest_partys_failure_at_once() -> None:
    """Party 2's frame fails to parse: the round stops without waiting for silent party 3
    (the timeout is 5 s), and party 2's error is the one raised."""
    server, parties = _gathering_server(3)
    await parties[1].send(SERVER, Slow(payload=SlowToParse(b"ok" * 50_000)))
    await parties[2].send(SERVER, Slow(payload=SlowToParse(b"bad" * 50_000)))
    with trio.fail_after(2), pytest.raises(ProtocolError, match="hostile payload"):
        await server.gather(Slow)


async def test_gather_stops_reading_at_an_abort() -> None:
    """Party 1 aborted and party 2 is silent: the abort surfaces at once, not after
    party 2's timeout (5 s)."""
    server, parties = _gathering_server(2)
    await parties[1].send_abort("disk full")
    with trio.fail_after(2), pytest.raises(PartyDropped, match=r"party 1 .*disk full"):
        await server.gather(Slow)


async def test_gather_checks_parties_in_order() -> None:
    """Party 1 aborted and party 2 sent garbage: party 1's abort is what surfaces."""
    server, parties = _gathering_server(2)
    await parties[1].send_abort("disk full")
    await parties[2].send(SERVER, Slow(payload=SlowToParse(b"bad" * 50_000)))
    with pytest.raises(PartyDropped, match=r"party 1 .*disk full"):
        await server.gather(Slow)


class Boom(RuntimeError):
    pass


async def test_a_failing_party_cancels_the_federation_and_its_error_surfaces() -> None:
    zscore = get_protocol("zscore", "plain")
    reached_end: list[int] = []

    async def failing_party(ctx, X, options):
        if ctx.me == 2:
            raise Boom("party 2 broke")
        result = await zscore.party(ctx, X, options)
        reached_end.append(ctx.me)
        return result

    protocol = zscore.with_roles(party=failing_party)
    with trio.fail_after(5), pytest.raises(Boom, match="party 2 broke"):
        await run_federation(protocol, [np.ones((3, 2))] * 3)
    assert reached_end == []


async def test_a_party_sending_a_wrong_width_vector_is_named() -> None:
    zscore = get_protocol("zscore", "plain")

    async def lying_party(ctx, X, options):
        if ctx.me == 3:
            await ctx.send(SERVER, LocalSums(count=np.ones(5), total=np.ones(5)))
            await trio.sleep_forever()
        return await zscore.party(ctx, X, options)

    protocol = zscore.with_roles(party=lying_party)
    with trio.fail_after(5), pytest.raises(ProtocolError, match="party 3"):
        await run_federation(protocol, [np.ones((3, 2))] * 3)


def _every_error() -> list[Exception]:
    from fednorm.engine.ckks.levels import LevelBudgetError
    from fednorm.engine.ckks.multiparty.decryption import DecodeOverflow
    from fednorm.multihost.handshake import PartyWithdrew, Withdrawal
    from fednorm.transport.tcp import ConnectFailed, HandshakeRefused

    return [InputError("bad"), ProtocolError("odd frame"), PartyDropped("party 2", "gone"),
            ProtocolTimeout("party 3", 60.0, "ckks.key_shares"), PartyWithdrew(4, "disk full"),
            Withdrawal("no data"), HandshakeRefused("wrong certificate"),
            ConnectFailed("no route"), DecodeOverflow("too large"), LevelBudgetError("deep")]


@pytest.mark.parametrize("error", _every_error(), ids=lambda e: type(e).__name__)
def test_errors_cross_process_boundaries(error: Exception) -> None:
    """A study grid's worker pool pickles a run's error to its parent: an error whose
    constructor takes other arguments than its message must survive that (a
    ProtocolTimeout once killed the pool's result thread and hung the grid)."""
    import pickle

    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert back.__dict__ == error.__dict__


# -- signatures on key shares ---------------------------------------------------------------
def test_a_signature_vouches_for_one_share_in_one_place_only() -> None:
    """What a party signs binds session, protocol, round, kind, party and the share's
    digest: a signature moved to any other of them, or made with another party's key,
    does not verify; a trusted setup takes no certificate from the wire."""
    import dataclasses
    import pickle

    from fednorm.engine import signing

    keyrings = signing.trusted_setup([1, 2, 3])
    statement = signing.Statement("s1", "zscore-mhe/setup", 1, "ckks.key_shares", 2,
                                  b"\1" * 32)
    signature = keyrings[2].signer.sign(statement)
    verifier = keyrings[1].verifier
    signing.verify(verifier, statement, signature, b"")
    moved = {"session": "s2", "protocol": "minmax-mhe/setup", "round": 2,
             "kind": "ckks.relin_round2", "party": 3, "digest": b"\2" * 32}
    for name, value in moved.items():
        with pytest.raises(ProtocolError, match="does not verify"):
            signing.verify(verifier, dataclasses.replace(statement, **{name: value}),
                           signature, b"")
    with pytest.raises(ProtocolError, match="does not verify"):
        signing.verify(verifier, statement, keyrings[3].signer.sign(
            dataclasses.replace(statement, party=3)), b"")
    with pytest.raises(ProtocolError, match="share of party 2 is unsigned"):
        signing.verify(verifier, statement, b"", b"")
    with pytest.raises(ProtocolError, match="malformed signature"):
        signing.verify(verifier, statement, "not bytes", b"")
    with pytest.raises(ProtocolError, match="handed out directly"):
        signing.verify(verifier, statement, signature, b"a certificate")
    with pytest.raises(ProtocolError, match="no verification key for party 4"):
        signing.verify(verifier, dataclasses.replace(statement, party=4), signature, b"")
    with pytest.raises(InputError, match="cannot sign for party 2"):
        keyrings[1].signer.sign(statement)
    with pytest.raises(TypeError, match="private key"):
        pickle.dumps(keyrings[1].signer)


async def test_a_party_without_a_signing_key_stops_before_any_key_setup_work() -> None:
    from fednorm.protocols import FitOptions

    with pytest.raises(FednormError, match=r"party [12] has no signing key"):
        await run_federation(get_protocol("zscore", "mhe"), [np.ones((3, 1))] * 2,
                             FitOptions(preset="test"), keyrings={})
