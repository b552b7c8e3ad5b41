"""The message flow every collective operation on a ciphertext shares.

The server broadcasts a request and gathers one share message per party, inside the
operation's sub-protocol; a party answers with its share in the same sub-protocol.
"""

from __future__ import annotations

from typing import TypeVar

from fednorm.engine.messages import Message
from fednorm.engine.runtime import SERVER, RoleContext

M = TypeVar("M", bound=Message)


async def request_shares(rc: RoleContext, name: str, request: Message,
                         reply: type[M]) -> list[M]:
    """Server: send ``request`` to every party, return their ``reply`` messages in party
    order (the order the engine's aggregations expect)."""
    with rc.subprotocol(name):
        await rc.broadcast(request)
        replies = await rc.gather(reply)
    return [replies[p] for p in rc.parties]


async def send_share(rc: RoleContext, name: str, share: Message) -> None:
    """Party: answer the server's request of sub-protocol ``name``."""
    with rc.subprotocol(name):
        await rc.send(SERVER, share)
