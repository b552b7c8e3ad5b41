"""The k-th ranked element in the clear (paper Algorithm 4, plaintext counts).

The search itself is :mod:`fednorm.protocols.rank`; here every party sends its counts
of values ≤ each probe point to the server, which adds them up (and so sees each
party's counts).
"""

from __future__ import annotations

import numpy as np

from fednorm.engine.messages import Message, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.base import gathered_vectors
from fednorm.protocols.rank import (
    SEARCH_PLAINTEXT,
    RankDone,
    RankProbe,
    RankSearch,
    SortedColumns,
    search_party,
    search_server,
)

PLAINTEXT = {**SEARCH_PLAINTEXT, "rank.counts": ("at_most",)}
"""The ledger's entry for the plaintext search: probes out, every party's counts back."""


@message("rank.counts")
class RankCounts(Message):
    """A party's number of values ≤ each probe point."""

    at_most: np.ndarray


class PlainCounts:
    """Counts in the clear: the server sees every party's counts (plaintext mode)."""

    async def pooled(self, ctx: RoleContext, width: int) -> np.ndarray:
        replies = await ctx.gather(RankCounts)
        return gathered_vectors(replies, "at_most", width).sum(axis=0)

    async def contribute(self, ctx: RoleContext, counts: np.ndarray) -> None:
        await ctx.send(SERVER, RankCounts(at_most=counts))

    async def next_probe(self, ctx: RoleContext) -> RankProbe | RankDone:
        return await ctx.receive(SERVER, (RankProbe, RankDone))


async def kth_server(ctx: RoleContext, search: RankSearch) -> np.ndarray:
    """Server: every target of ``search`` found, on the parties' plaintext counts."""
    return await search_server(ctx, search, PlainCounts())


async def kth_party(ctx: RoleContext, columns: SortedColumns) -> None:
    """Party: answer the server's probes with this party's counts until it is done."""
    await search_party(ctx, columns, PlainCounts())
