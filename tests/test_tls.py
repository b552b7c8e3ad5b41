"""Mutual TLS of a multi-host run: admission by certificate, refusals, the certificates
`fednorm certs init` writes, and the signing keys parties take from them."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import shutil
import ssl
import stat
from pathlib import Path

import pytest
import trio
import trio.testing
from cryptography import x509
from handshakes import hello, lobby

from fednorm.engine.errors import InputError, PartyDropped, ProtocolError
from fednorm.multihost.handshake import (
    HANDSHAKE_MAX_FRAME,
    Hello,
    Ready,
    admit_connection,
    connect_party,
    send_handshake,
)
from fednorm.multihost.lobby import Lobby
from fednorm.transport.tcp import HandshakeRefused
from fednorm.transport.tls import init_certs, party_context, party_keyring, server_context


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second federation: same names, another CA."""
    directory = tmp_path_factory.mktemp("other-certs")
    init_certs(directory, parties=3)
    return directory




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
