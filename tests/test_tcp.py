"""TCP transport: framing limits, handshake messages, admission rules, mutual TLS, certs."""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import re
import shutil
import ssl
import stat
import struct
from pathlib import Path

import msgpack
import pytest
import trio
import trio.testing
from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

from fednorm.engine.codec import WIRE_VERSION
from fednorm.engine.errors import InputError, PartyDropped, ProtocolError
from fednorm.multihost.handshake import (
    HANDSHAKE_MAX_FRAME,
    NET_VERSION,
    Hello,
    Ready,
    Refusal,
    Start,
    Welcome,
    admit_connection,
    connect_party,
    decode_handshake,
    encode_handshake,
    send_handshake,
)
from fednorm.multihost.lobby import Lobby, SchemaMismatch
from fednorm.transport.tcp import HandshakeRefused, TcpLink, parse_address
from fednorm.transport.tls import init_certs, party_context, party_keyring, server_context

FEATURES = ("a", "b")


def hello(party: int = 1, **changes: object) -> Hello:
    fields = {"version": NET_VERSION, "wire": WIRE_VERSION, "party": party,
              "features": FEATURES, **changes}
    return Hello(**fields)  # type: ignore[arg-type]


def lobby(parties: int = 3) -> Lobby:
    return Lobby(Welcome(NET_VERSION, "session-1", ("zscore",), "plain", parties, {}),
                 "zscore-plain")


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second federation: same names, another CA."""
    directory = tmp_path_factory.mktemp("other-certs")
    init_certs(directory, parties=3)
    return directory


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


async def test_an_oversized_length_prefix_is_refused_before_reading_the_body() -> None:
    link, raw = link_and_raw(max_frame=1024)
    await raw.send_all(struct.pack(">I", 2**32 - 1))  # and no body at all
    with trio.fail_after(2), pytest.raises(ProtocolError, match="4294967295 bytes"):
        await link.receive()


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


# -- mutual TLS -------------------------------------------------------------------------
async def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext,
                    room: Lobby, claim: Hello) -> tuple[object, object]:
    """One connection over loopback: (server result or error, client result or error)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    results: dict[str, object] = {}

    async def server_side() -> None:
        stream = await listeners[0].accept()
        try:
            results["server"] = await admit_connection(stream, server_ctx, room, timeout=5)
        except Exception as exc:
            results["server"] = exc

    async def client_side() -> None:
        try:
            link, welcome = await connect_party("127.0.0.1", port, client_ctx, claim,
                                                connect_timeout=5, handshake_timeout=5)
            await send_handshake(link, Ready(welcome.session))
            results["client"] = link, welcome
        except Exception as exc:
            results["client"] = exc

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server_side)
            nursery.start_soon(client_side)
    await listeners[0].aclose()
    return results["server"], results["client"]


def mixed_context(trusted: Path, identity: Path | None, stem: str = "party-1"
                  ) -> ssl.SSLContext:
    """A client trusting ``trusted``'s CA and presenting ``identity``'s ``stem`` cert."""
    context = ssl.create_default_context(cafile=str(trusted / "ca.pem"))
    if identity is not None:
        context.load_cert_chain(str(identity / f"{stem}.pem"), str(identity / f"{stem}.key"))
    return context


async def test_a_party_is_admitted_and_frames_flow_both_ways(certs: Path) -> None:
    room = lobby()
    server, client = await handshake(server_context(certs), party_context(certs, 2), room,
                                     hello(2))
    party, server_link = server
    client_link, welcome = client
    assert party == 2 and server_link.peer == "party 2"
    assert welcome == room.welcome and room.features is None  # agreed once all are in
    await server_link.send(b"ping")
    assert await client_link.receive() == b"ping"
    big = b"p" * (HANDSHAKE_MAX_FRAME * 4)  # protocol frames may exceed handshake ones
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client_link.send, big)
        assert await server_link.receive() == big
    await client_link.aclose()
    with pytest.raises(PartyDropped, match="party 2 dropped"):
        await server_link.receive()
    await server_link.aclose()


@pytest.mark.parametrize("identity, stem, reason", [
    ("other", "party-1", "certificate verify failed"),  # a client cert from another CA
    (None, "party-1", "did not return a certificate|certificate required"),
    ("ours", "server", "unsuitable certificate purpose"),  # a server cert as a client
])
async def test_a_client_without_a_good_certificate_is_refused_in_tls(
    certs: Path, other_certs: Path, identity: str | None, stem: str, reason: str
) -> None:
    directory = {"ours": certs, "other": other_certs, None: None}[identity]
    room = lobby()
    server, client = await handshake(server_context(certs),
                                     mixed_context(certs, directory, stem), room, hello(1))
    assert isinstance(server, HandshakeRefused), server
    assert isinstance(client, HandshakeRefused), client
    assert re.search(reason, str(server)), server
    assert room.features is None  # nothing claimed, no protocol message exchanged


async def test_a_certificate_of_another_party_is_refused(certs: Path) -> None:
    room = lobby()
    server, client = await handshake(server_context(certs), party_context(certs, 2), room,
                                     hello(1))
    expected = "the certificate is party 2's but the handshake claims party 1"
    assert isinstance(server, HandshakeRefused) and expected in str(server)
    assert isinstance(client, HandshakeRefused) and f"server refused: {expected}" in str(client)
    assert room.features is None


async def test_a_server_from_another_ca_is_refused_by_the_party(certs: Path,
                                                                other_certs: Path) -> None:
    server, client = await handshake(server_context(other_certs), party_context(certs, 1),
                                     lobby(), hello(1))
    assert isinstance(client, HandshakeRefused) and "certificate verify failed" in str(client)
    assert isinstance(server, HandshakeRefused)


# -- certificates -----------------------------------------------------------------------
def test_certs_init_writes_the_documented_layout(certs: Path) -> None:
    names = sorted(p.name for p in certs.iterdir())
    assert names == ["ca.key", "ca.pem", "party-1.key", "party-1.pem", "party-2.key",
                     "party-2.pem", "party-3.key", "party-3.pem", "server.key", "server.pem"]
    for key in certs.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    server = x509.load_pem_x509_certificate((certs / "server.pem").read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "fednorm.example"} <= set(san.get_values_for_type(x509.DNSName))
    assert {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("10.1.2.3")} <= set(
        san.get_values_for_type(x509.IPAddress))
    party = x509.load_pem_x509_certificate((certs / "party-3.pem").read_bytes())
    assert party.subject.rfc4514_string() == "CN=party-3"


def test_certs_init_refuses_to_replace_a_ca(certs: Path) -> None:
    with pytest.raises(InputError, match="already holds a CA"):
        init_certs(certs, parties=3)


def test_a_renamed_party_certificate_fails_before_connecting(certs: Path,
                                                             tmp_path: Path) -> None:
    for name in ("ca.pem", "party-2.pem", "party-2.key"):
        shutil.copy(certs / name, tmp_path / name.replace("party-2", "party-1"))
    with pytest.raises(InputError, match="not party 1's certificate"):
        party_context(tmp_path, 1)
    with pytest.raises(InputError, match="no party 3 certificate"):
        party_context(tmp_path, 3)
    with pytest.raises(InputError, match="not a certs directory"):
        server_context(tmp_path / "nowhere")


# -- signing keys from the certificates ----------------------------------------------------
def test_parties_sign_with_their_certificates_and_check_them_against_the_ca(
    certs: Path, other_certs: Path,
) -> None:
    from cryptography.hazmat.primitives import serialization

    from fednorm.engine import signing

    statement = signing.Statement("s1", "zscore-mhe/setup", 1, "ckks.key_shares", 2,
                                  b"\1" * 32)
    two, three = party_keyring(certs, 2), party_keyring(certs, 3)
    verifier = party_keyring(certs, 1).verifier
    signing.verify(verifier, statement, two.signer.sign(statement), two.signer.certificate)
    with pytest.raises(ProtocolError, match="sent for party 2 is party 3's"):
        signing.verify(verifier, statement, three.signer.sign(
            dataclasses.replace(statement, party=3)), three.signer.certificate)
    stranger = party_keyring(other_certs, 2).signer  # same name, another federation's CA
    with pytest.raises(ProtocolError, match="not signed by the federation CA"):
        signing.verify(verifier, statement, stranger.sign(statement), stranger.certificate)
    with pytest.raises(ProtocolError, match="missing or unreadable"):
        signing.verify(verifier, statement, two.signer.sign(statement), b"")
    key_of_one = serialization.load_pem_private_key((certs / "party-1.key").read_bytes(), None)
    cert_of_two = x509.load_pem_x509_certificate((certs / "party-2.pem").read_bytes())
    with pytest.raises(InputError, match="does not belong to its certificate"):
        signing.Signer.of_certificate(2, key_of_one, cert_of_two)
    with pytest.raises(InputError, match="not party 1's"):
        signing.Signer.of_certificate(1, key_of_one, cert_of_two)
