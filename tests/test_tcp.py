"""TCP transport: framing limits, handshake messages, admission rules (mutual TLS,
certificates and signing keys: test_tls.py)."""

from __future__ import annotations

import contextlib
import struct

import msgpack
import pytest
import trio
import trio.testing
from handshakes import FEATURES, hello, lobby
from hypothesis import given, settings
from hypothesis import strategies as st

from fednorm.engine.errors import InputError, PartyDropped, ProtocolError
from fednorm.multihost.handshake import (
    NET_VERSION,
    Hello,
    Refusal,
    Start,
    Welcome,
    decode_handshake,
    encode_handshake,
)
from fednorm.multihost.lobby import Lobby, SchemaMismatch
from fednorm.transport.tcp import HandshakeRefused, TcpLink, parse_address


# -- framing ----------------------------------------------------------------------------
def link_and_raw(max_frame: int = 1024) -> tuple[TcpLink, trio.abc.Stream]:
    ours, theirs = trio.testing.memory_stream_pair()
    return TcpLink(ours, "party 7", max_frame), theirs


async def test_frames_round_trip_whatever_the_chunking() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    sender, receiver = TcpLink(ours, "a", 2**21), TcpLink(theirs, "b", 2**21)
    frames = [b"", b"x", bytes(range(256)) * 300, b"\x00" * 2**20]
    async with trio.open_nursery() as nursery:
        async def send_all() -> None:
            for frame in frames:
                await sender.send(frame)

        nursery.start_soon(send_all)
        assert [await receiver.receive() for _ in frames] == frames


async def test_frames_reassemble_from_single_bytes() -> None:
    link, raw = link_and_raw()
    wire = struct.pack(">I", 5) + b"hello" + struct.pack(">I", 2) + b"ok"
    async with trio.open_nursery() as nursery:
        async def trickle() -> None:
            for byte in wire:
                await raw.send_all(bytes([byte]))
                await trio.sleep(0)

        nursery.start_soon(trickle)
        assert await link.receive() == b"hello"
        assert await link.receive() == b"ok"


async def test_an_oversized_length_prefix_is_refused_and_its_body_never_kept() -> None:
    """A 4 GiB frame announced, no body sent: refused within a second, nothing kept."""
    link, raw = link_and_raw(max_frame=1024)
    await raw.send_all(struct.pack(">I", 2**32 - 1))  # and no body at all
    with trio.fail_after(2), pytest.raises(ProtocolError, match="4294967295 bytes"):
        await link.receive()
    assert not link._buffer


async def test_an_oversized_frame_is_read_to_its_end_so_its_sender_is_not_reset() -> None:
    """The refused frame's body is read to its last byte and dropped (over TCP, the
    sender's send then completes and it can read the abort that says why, where unread
    bytes would reset the connection under it): what the stream holds next is what
    followed the frame, and nothing of it stays in the buffer."""
    link, raw = link_and_raw(max_frame=1024)
    body = b"x" * 5000
    with trio.fail_after(2):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(raw.send_all, struct.pack(">I", len(body)) + body + b"after")
            with pytest.raises(ProtocolError, match="5000 bytes"):
                await link.receive()
            assert await link._read(5, boundary=False) == b"after"


async def test_an_oversized_frame_is_not_sent() -> None:
    link, _ = link_and_raw(max_frame=8)
    with pytest.raises(ProtocolError, match="limit is 8"):
        await link.send(b"123456789")


async def test_eof_between_frames_is_a_dropout() -> None:
    link, raw = link_and_raw()
    await raw.aclose()
    with pytest.raises(PartyDropped, match=r"^party 7 dropped: connection closed$"):
        await link.receive()


async def test_eof_inside_a_frame_is_a_dropout_that_says_so() -> None:
    link, raw = link_and_raw()
    await raw.send_all(struct.pack(">I", 10) + b"abc")
    await raw.aclose()
    with pytest.raises(PartyDropped, match=r"mid-frame \(3 of 10 bytes\)"):
        await link.receive()


async def test_sending_on_a_closed_link_is_a_dropout() -> None:
    link, raw = link_and_raw()
    await raw.aclose()
    with pytest.raises(PartyDropped, match="party 7 dropped"):
        for _ in range(3):  # the first send may still fit in the pipe
            await link.send(b"x" * 100)


# -- handshake messages -----------------------------------------------------------------
@pytest.mark.parametrize("message", [
    hello(2, session="s", protocol="robust-plain"),
    Welcome(NET_VERSION, "s", ("robust", "zscore"), "plain", 3,
            {"epsilon": None, "vabs": [1.0, 2.0]}),
    Start("s"),
    Refusal("because"),
])
def test_handshake_messages_round_trip(message: object) -> None:
    assert decode_handshake(encode_handshake(message), type(message)) == message


def test_a_refusal_is_raised_with_its_reason() -> None:
    with pytest.raises(HandshakeRefused, match="server refused: party 9 is not expected"):
        decode_handshake(encode_handshake(Refusal("party 9 is not expected")), Welcome)


@pytest.mark.parametrize("body, match", [
    ({"type": "start"}, "expected a 'hello'"),
    ({"type": "hello", "version": 1, "wire": 1, "party": 1}, "has fields"),
    ({"type": "hello", "version": 1, "wire": 1, "party": 1, "features": ["a"], "x": 1},
     "has fields"),
    ({"type": "hello", "version": 1, "wire": 1, "party": True, "features": ["a"]}, "'party'"),
    ({"type": "hello", "version": 1, "wire": 1, "party": 1, "features": [1]}, "'features'"),
    ([1, 2, 3], "not a map"),
])
def test_malformed_hellos_are_protocol_errors(body: object, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_handshake(msgpack.packb(body), Hello)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300))
def test_random_handshake_bytes_are_protocol_errors_never_crashes(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_handshake(data, Hello)


# -- admission rules --------------------------------------------------------------------
@pytest.mark.parametrize("claim, cert_party, reason", [
    (hello(1, version=99), 1, "handshake version 99"),
    (hello(1, wire=99), 1, "wire version 99"),
    (hello(1), None, "names no party"),
    (hello(1), 2, "certificate is party 2's but the handshake claims party 1"),
    (hello(4), 4, r"party 4 is not expected: parties are 1..3"),
    (hello(0), 0, "party 0 is not expected"),
    (hello(1, session="old"), 1, "wants session 'old'"),
    (hello(1, protocol="robust-plain"), 1, "wants protocol 'robust-plain'"),
    (hello(1, features=()), 1, "no features"),
])
def test_the_lobby_refuses_what_it_must(claim: Hello, cert_party: int | None,
                                        reason: str) -> None:
    room = lobby()
    with pytest.raises(HandshakeRefused, match=reason):
        room.reserve(claim, cert_party)
    assert room.features is None


def fill(room: Lobby, claims: dict[int, tuple[str, ...]]) -> None:
    for party, features in claims.items():
        room.reserve(hello(party, features=features), party)
        room.admit(party, link_and_raw()[0])


def test_the_lobby_admits_each_party_once() -> None:
    room = lobby(parties=2)
    room.reserve(hello(2), 2)
    with pytest.raises(HandshakeRefused, match="party 2 is already connected"):
        room.reserve(hello(2), 2)
    room.release(2)  # a party that left frees its slot
    room.reserve(hello(2), 2)
    room.admit(2, link_and_raw()[0])
    assert room.missing() == [1] and not room.settled.is_set()
    room.reserve(hello(1), 1)
    room.admit(1, link_and_raw()[0])
    assert room.missing() == [] and room.settled.is_set()
    assert room.agree() == FEATURES


@pytest.mark.parametrize("first", [1, 2, 3])
def test_the_majority_sets_the_columns_whoever_joins_first(first: int) -> None:
    claims = {1: FEATURES, 2: ("a", "x", "y"), 3: FEATURES}
    room = lobby()
    # Nobody is refused for columns while the house fills, in any order of arrival.
    fill(room, {first: claims[first]} | claims)
    with pytest.raises(SchemaMismatch) as refused:
        room.agree()
    assert str(refused.value) == ("party 2's columns differ from the federation's: "
                                  "lacks 'b' and has unexpected 'x', 'y'")


def test_without_a_majority_every_party_is_named() -> None:
    room = lobby(parties=2)
    fill(room, {1: FEATURES, 2: ("a", "c")})
    with pytest.raises(SchemaMismatch, match=r"no set has a majority \(party 1: a, b; "
                                             r"party 2: a, c\); give the server --features"):
        room.agree()


def test_a_configured_schema_refuses_a_differing_party_at_once() -> None:
    room = Lobby(lobby().welcome, "zscore-plain", schema=FEATURES)
    with pytest.raises(SchemaMismatch, match="party 1's columns differ from the "
                                             "federation's: has unexpected 'c'"):
        room.reserve(hello(1, features=("a", "b", "c")), 1)
    with pytest.raises(SchemaMismatch, match="another order"):
        room.reserve(hello(1, features=("b", "a")), 1)
    room.reserve(hello(1), 1)
    assert room.features == FEATURES


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:5000", ("127.0.0.1", 5000)),
    ("example.org:0", ("example.org", 0)),
    ("[::1]:443", ("::1", 443)),
])
def test_addresses_parse(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["5000", ":5000", "host:", "host:port", "host:70000"])
def test_bad_addresses_are_input_errors(text: str) -> None:
    with pytest.raises(InputError, match="HOST:PORT"):
        parse_address(text)


