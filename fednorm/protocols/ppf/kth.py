"""PPF k-th ranked element (paper Algorithm 4): the search on encrypted pooled counts.

The search itself is :mod:`fednorm.protocols.rank` (the server's brackets and probes,
a party's sorted columns and its refusals); here each round every party encrypts its
counts of values ≤ each probe point as a sum upload, the server adds the ciphertexts
and the parties decrypt the pooled counts collectively (flooded): the server learns
only the pooled counts at its probes.  All features and all ranks share one
ciphertext per round, their counts packed several to a slot once n_g bounds them
(:class:`~fednorm.protocols.ppf.pooled.CountPacking`).

Algorithm 4 plans its ranks from the pooled count n_g, which this module also pools
(:func:`reveal_pooled_counts` / :func:`share_pooled_counts`, Algorithm 3 lines 10–12).

Entry points: the server runs :func:`kth_server` on a :class:`~fednorm.protocols.rank.
RankSearch` (:func:`~fednorm.protocols.rank.start_search`) and every party
:func:`kth_party` on its :class:`~fednorm.protocols.rank.SortedColumns`, both after
collective key setup (no relinearization key needed: nothing is multiplied).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fednorm.engine.messages import Message, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.base import FitOptions, agreed_width, feature_counts
from fednorm.protocols.collective import PartyCrypto, ServerCrypto
from fednorm.protocols.collective.sums import SumUpload
from fednorm.protocols.ledger import Allowance
from fednorm.protocols.ppf import pooled
from fednorm.protocols.ppf.phases import serve_phase
from fednorm.protocols.rank import (
    SEARCH_PLAINTEXT,
    RankDone,
    RankProbe,
    RankSearch,
    SortedColumns,
    opening_probe,
    search_party,
    search_server,
)

POOLED_COUNT = pooled.POOLED_SUM
"""n_g: one flooded decryption of the pooled per-feature counts."""

SEARCH_ROUND = pooled.POOLED_SUM
"""Each search round: one flooded decryption of the pooled counts at the probes."""

PLAINTEXT = {
    **SEARCH_PLAINTEXT,
    **pooled.PLAINTEXT,
    "ppf_robust.pooled_counts": ("count",),
}
"""The ledger's entry: the probes, the number of counts, and the revealed n_g."""


OPENING_PLAINTEXT = {"ppf_robust.counts_and_opening": ("width",)}
"""The ledger's entry for the unbounded search's first upload: its number of features."""


@message("ppf_robust.counts_and_opening")
class CountsAndOpening(Message):
    """A party's n_p per feature, then its counts at the unbounded search's opening
    probe (:func:`~fednorm.protocols.rank.opening_probe`), in one sum upload: the search's
    first round needs no probe from the server, so it travels with the count."""

    values: SumUpload
    width: int  # features


@message("ppf_robust.pooled_counts")
class PooledCounts(Message):
    """n_g per feature, decrypted collectively (Algorithm 3, line 12)."""

    count: np.ndarray


async def reveal_pooled_counts(crypto: ServerCrypto) -> np.ndarray:
    """Server: n_g per feature, pooled, decrypted (rounded to integers) and broadcast."""
    count = np.rint(await pooled.pooled_sum(crypto))
    await crypto.rc.broadcast(PooledCounts(count=count))
    return count


async def share_pooled_counts(crypto: PartyCrypto, counts: np.ndarray) -> np.ndarray:
    """Party side of :func:`reveal_pooled_counts`: send ``counts``, help decrypt n_g."""
    await pooled.send_sum(crypto, counts)
    return (await serve_phase(crypto, PooledCounts, POOLED_COUNT)).count


async def reveal_counts_and_opening(crypto: ServerCrypto, options: FitOptions,
                                    quantiles: Sequence[float]
                                    ) -> tuple[np.ndarray, RankProbe, np.ndarray]:
    """Server: n_g per feature (broadcast), the opening probe and its pooled counts, from
    one flooded sum decryption of the parties' :class:`CountsAndOpening`."""
    replies = await crypto.rc.gather(CountsAndOpening)
    width = agreed_width(replies)
    opening = opening_probe(width, crypto.ckks.slots - width, quantiles, options)
    total = await crypto.add_all({p: r.values for p, r in replies.items()})
    pooled = np.rint(await crypto.decrypt_sum(total, width + len(opening.points)))
    await crypto.rc.broadcast(PooledCounts(count=pooled[:width]))
    return pooled[:width], opening, pooled[width:]


async def share_counts_and_opening(crypto: PartyCrypto, X: np.ndarray,
                                   columns: SortedColumns, options: FitOptions,
                                   quantiles: Sequence[float]) -> np.ndarray:
    """Party side of :func:`reveal_counts_and_opening`: its counts and its counts at the
    opening probe (which it computes itself), one sum upload, the opening counted as a
    round of ``columns`` (``X``'s, whose limits the caller agrees once n_g is known);
    returns n_g."""
    width = X.shape[1]
    opening = opening_probe(width, crypto.ckks.slots - width, quantiles, options)
    at_most = columns.count_at_most(opening)
    upload = await crypto.encrypt_for_sum(np.concatenate([feature_counts(X), at_most]))
    await crypto.rc.send(SERVER, CountsAndOpening(values=upload, width=width))
    return (await serve_phase(crypto, PooledCounts, POOLED_COUNT)).count


def count_packing(count: np.ndarray) -> pooled.CountPacking:
    """How the search's counts travel, from n_g per feature (public): no pooled count
    exceeds the largest."""
    return pooled.CountPacking.for_bound(np.max(count, initial=0.0))


def probe_capacity(crypto: ServerCrypto | PartyCrypto, count: np.ndarray) -> int:
    """The most counts one search round's ciphertext carries, packed."""
    return count_packing(count).capacity(crypto.ckks.slots)


class EncryptedCountAggregator:
    """The k-th search's counts, pooled under encryption (one decryption per round)."""

    def __init__(self, crypto: ServerCrypto | PartyCrypto, count: np.ndarray) -> None:
        self._crypto = crypto
        self._packing = count_packing(count)
        self._owed = Allowance()  # nothing before the first probe, then one round's

    async def pooled(self, ctx: RoleContext, width: int) -> np.ndarray:
        assert isinstance(self._crypto, ServerCrypto)
        values = await pooled.pooled_sum(self._crypto, self._packing.slots(width))
        return self._packing.unpack(values, width)

    async def contribute(self, ctx: RoleContext, counts: np.ndarray) -> None:
        assert isinstance(self._crypto, PartyCrypto)
        await pooled.send_sum(self._crypto, self._packing.pack(counts))
        self._owed = SEARCH_ROUND

    async def next_probe(self, ctx: RoleContext) -> RankProbe | RankDone:
        assert isinstance(self._crypto, PartyCrypto)
        owed, self._owed = self._owed, Allowance()
        return await serve_phase(self._crypto, (RankProbe, RankDone), owed)


async def kth_server(crypto: ServerCrypto, search: RankSearch, count: np.ndarray
                     ) -> np.ndarray:
    """Server: every target of ``search`` found, on encrypted pooled counts (``count``:
    n_g per feature, which bounds them)."""
    return await search_server(crypto.rc, search, EncryptedCountAggregator(crypto, count))


async def kth_party(crypto: PartyCrypto, columns: SortedColumns, count: np.ndarray) -> None:
    """Party: answer the server's probes with encrypted counts until it is done."""
    await search_party(crypto.rc, columns, EncryptedCountAggregator(crypto, count))
