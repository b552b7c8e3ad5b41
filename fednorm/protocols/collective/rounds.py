"""The message flow every collective operation on a ciphertext shares.

The server broadcasts a request (and what it relays with it, one upload a frame) and
gathers one share message per party, inside the operation's sub-protocol; a party
answers with its share in the same sub-protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.collective.messages import RelayedUpload

M = TypeVar("M", bound=Message)


async def request_shares(rc: RoleContext, name: str, request: Message,
                         reply: type[M], uploads: tuple[int, Sequence[object]] | None = None
                         ) -> list[M]:
    """Server: send ``request`` to every party (followed by ``uploads``, an index and the
    uploads of that index to relay: :func:`relay`), return their ``reply`` messages in
    party order (the order the engine's aggregations expect)."""
    with rc.subprotocol(name):
        await rc.broadcast(request)
        if uploads is not None:
            await relay(rc, *uploads)
        replies = await rc.gather(reply)
    return [replies[p] for p in rc.parties]


async def relay(rc: RoleContext, index: int, uploads: Sequence[object]) -> None:
    """Server: send every party each of ``uploads`` (#``index``, in party order), one a
    frame, so a frame holds one upload at any P."""
    for upload in uploads:
        await rc.broadcast(RelayedUpload(index=index, upload=upload))  # type: ignore[arg-type]


async def relayed(rc: RoleContext, index: int, count: int, request: str) -> list[object]:
    """Party: the ``count`` uploads #``index`` the server relays next (:func:`relay`),
    unchecked (:func:`.sums.verified_combination` checks them); ``request`` names what
    relays them in a refusal."""
    uploads: list[object] = []
    for _ in range(count):
        frame = await rc.receive(SERVER, RelayedUpload)
        if frame.index != index:
            raise ProtocolError(f"{request} relays an upload #{frame.index!r} among the "
                                f"uploads #{index}")
        uploads.append(frame.upload)
    return uploads


async def send_share(rc: RoleContext, name: str, share: Message) -> None:
    """Party: answer the server's request of sub-protocol ``name``."""
    with rc.subprotocol(name):
        await rc.send(SERVER, share)
