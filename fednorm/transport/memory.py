"""In-memory links on trio memory channels, for simulations in one process.

Every message still goes through the real codec as bytes, so a simulation
exercises the wire format and counts the same bytes a TCP run would send.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import trio

from fednorm.engine.errors import PartyDropped
from fednorm.engine.runtime import SERVER, Link, role_name

Star = tuple[Mapping[int, Link], Mapping[int, Link]]
StarLinks = Callable[[list[int]], AbstractAsyncContextManager[Star]]
"""What carries a star federation's frames: given the party ids, the server's links (by
party) and each party's link to the server, for as long as the context is open."""


class MemoryLink:
    """One end of a duplex in-memory pipe."""

    def __init__(
        self,
        peer: int,
        outgoing: trio.MemorySendChannel[bytes],
        incoming: trio.MemoryReceiveChannel[bytes],
    ) -> None:
        self.peer = peer
        self._outgoing = outgoing
        self._incoming = incoming

    async def send(self, frame: bytes) -> None:
        try:
            await self._outgoing.send(bytes(frame))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise PartyDropped(role_name(self.peer), "link closed") from None

    async def receive(self) -> bytes:
        try:
            return await self._incoming.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise PartyDropped(role_name(self.peer), "link closed") from None

    async def aclose(self) -> None:
        await self._outgoing.aclose()
        await self._incoming.aclose()


def link_pair(a: int, b: int) -> tuple[MemoryLink, MemoryLink]:
    """Two connected links: the first is ``a``'s end (peer ``b``), the second ``b``'s."""
    a_to_b_send, a_to_b_receive = trio.open_memory_channel[bytes](math.inf)
    b_to_a_send, b_to_a_receive = trio.open_memory_channel[bytes](math.inf)
    return MemoryLink(b, a_to_b_send, b_to_a_receive), MemoryLink(a, b_to_a_send, a_to_b_receive)


def star_links(parties: list[int]) -> tuple[dict[int, MemoryLink], dict[int, MemoryLink]]:
    """Links of a star federation: the server's (by party) and each party's (to the server)."""
    server_links: dict[int, MemoryLink] = {}
    party_links: dict[int, MemoryLink] = {}
    for party in parties:
        server_links[party], party_links[party] = link_pair(SERVER, party)
    return server_links, party_links


@asynccontextmanager
async def memory_star(parties: list[int]) -> AsyncIterator[Star]:
    """:func:`star_links` as a :data:`StarLinks` (the simulation's default transport)."""
    yield star_links(parties)
