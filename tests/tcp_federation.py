"""Federations over TCP + TLS on the loopback, authenticated as in a multi-host run:
links between a server and each party (for any in-process run, :func:`tcp_star`), and a
PPF federation with a deviating server — a real multi-host
:class:`~fednorm.multihost.server.Server` whose mhe protocol plays a test's server role,
and three real :class:`~fednorm.multihost.party.Party` runs, each watched."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import trio
from deviating import deviating

from fednorm.engine.errors import FednormError
from fednorm.engine.tracing import CryptoEvent, FrameEvent, Tracer
from fednorm.protocols import FitOptions
from fednorm.protocols.base import Protocol
from fednorm.transport.memory import Star, StarLinks
from fednorm.transport.tcp import DEFAULT_MAX_FRAME, TcpLink, tls_handshake
from fednorm.transport.tls import party_context, server_context

TEST = FitOptions(preset="test")
UPLOAD = "ppf_zscore.encrypted_sums"  # the first thing a z-score party encrypts


async def connected_pair(listener: trio.SocketListener, certs: Path, party: int
                         ) -> tuple[TcpLink, TcpLink]:
    """A connection to ``listener`` from ``party``, TLS with the federation's
    certificates: the server's end and the party's end."""
    port = listener.socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    accepted = await listener.accept()
    server_tls = trio.SSLStream(accepted, server_context(certs), server_side=True)
    party_tls = trio.SSLStream(client, party_context(certs, party),
                               server_hostname="localhost")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tls_handshake, server_tls, f"party {party}")
        nursery.start_soon(tls_handshake, party_tls, "server")
    return (TcpLink(server_tls, f"party {party}", DEFAULT_MAX_FRAME),
            TcpLink(party_tls, "server", DEFAULT_MAX_FRAME))


def tcp_star(certs: Path) -> StarLinks:
    """A :data:`~fednorm.transport.memory.StarLinks` of TCP + TLS links on the loopback,
    for ``run_federation(..., links=tcp_star(certs))``."""

    @asynccontextmanager
    async def star(parties: list[int]) -> AsyncIterator[Star]:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        server_links: dict[int, TcpLink] = {}
        party_links: dict[int, TcpLink] = {}
        try:
            for party in parties:
                server_links[party], party_links[party] = await connected_pair(
                    listeners[0], certs, party)
            yield server_links, party_links
        finally:
            for link in (*server_links.values(), *party_links.values()):
                await trio.aclose_forcefully(link.stream)
            for listener in listeners:
                await listener.aclose()

    return star


Transport = Callable[[Path], StarLinks | None]
"""A test parameter: the links a run uses (None: run_federation's memory default)."""


def parts(parties: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.normal(2, 3, size=(6 + p, 2)) for p in range(parties)]


class PartyWatch(Tracer):
    """What the parties send and encrypt, by party."""

    def __init__(self) -> None:
        self.sent: dict[str, list[str]] = {}
        self.encrypted: list[str] = []
        self.received: dict[str, list[str]] = {}

    def frame(self, event: FrameEvent) -> None:
        kinds = self.sent if event.direction == "sent" else self.received
        kinds.setdefault(event.role, []).append(event.kind)

    def crypto_call(self, event: CryptoEvent) -> None:
        if "encrypt" in event.call:
            self.encrypted.append(event.role)

    def assert_nothing_encrypted(self) -> None:
        assert not self.encrypted
        assert not any(UPLOAD in kinds for kinds in self.sent.values()), self.sent


def tcp_run(certs: Path, server, *,
            options: FitOptions = TEST, allowing: Collection[int] = (),
            method: str = "zscore") -> tuple[dict[int, BaseException], PartyWatch, object]:
    """PPF ``method`` (z-score) between a multi-host server playing ``server`` and three real
    :class:`Party` runs (those in ``allowing`` join the paper's algorithms): each party's
    error, what they sent, the server's outcome."""
    from fednorm.multihost.config import PartyConfig, ServerConfig, Timeouts
    from fednorm.multihost.party import Party
    from fednorm.multihost.server import Server
    from fednorm.protocols import get_protocol

    def deviating_server(method: str, privacy: str) -> Protocol:
        if privacy == "mhe":
            return deviating(method, privacy, server=server)
        return get_protocol(method, privacy)
    slow = Timeouts(join=30.0, handshake=10.0, protocol=120.0)
    config = ServerConfig("127.0.0.1", 0, parties=3, methods=(method,), certs=certs,
                          privacy="mhe", options=options, timeouts=slow)
    watch, errors = PartyWatch(), {}
    tcp_server = Server(config, protocols=deviating_server)

    async def party(p: int, port: int) -> None:
        config = PartyConfig("127.0.0.1", port, p, certs, slow,
                             allow_unflooded=p in allowing)
        try:
            await Party(config, tracer=watch).run(parts()[p - 1], ["a", "b"])
        except FednormError as exc:
            errors[p] = exc

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(tcp_server.serve)
            for p in (1, 2, 3):
                nursery.start_soon(party, p, port)

    trio.run(main)
    return errors, watch, tcp_server.outcomes[0]
