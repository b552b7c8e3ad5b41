"""PPF robust scaling (paper Algorithm 3) on the PPF k-th ranked element (Algorithm 4).

Step by step with Algorithm 3:

1. collective key generation (line 1);
2. each party encrypts its per-feature counts n_p (lines 2–8); the server adds them and
   the parties decrypt the pooled counts n_g collectively (lines 10–12);
3. the quartile ranks follow from n_g (lines 13–17; :func:`~fednorm.protocols.rank.plan_quantiles`,
   with the interpolation of scikit-learn's ``RobustScaler`` or the paper's gap rule);
4. PPF MinMax gives the search bounds (lines 18–19);
5. the k-th element search (Algorithm 4): each round the server sends midpoints, every
   party encrypts its counts of values ≤ each midpoint, the server adds the ciphertexts
   and the pooled counts are decrypted collectively; all features and all ranks share
   one ciphertext per round (lines 20–24);
6. the quartiles are broadcast and each party scales locally (lines 25–26).

Revealed: n_g, the global min and max, each round's midpoints and the pooled counts at
them (the "> M" count is n_g − L and is never sent), and Q1, median, Q3.
"""

from __future__ import annotations

import numpy as np
import openfhe

from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message, as_float_vector, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.base import FitOptions, check_party_data, feature_counts, register
from fednorm.protocols.collective import (
    PartyCrypto,
    ServerCrypto,
    serve_until,
    setup_party,
    setup_server,
)
from fednorm.protocols.normalizers import RobustNormalizer
from fednorm.protocols.plain.robust import QUARTILES, RobustResult
from fednorm.protocols.ppf import minmax as ppf_minmax
from fednorm.protocols.rank import (
    RankDone,
    RankProbe,
    SortedColumns,
    kth_party,
    kth_server,
    plan_quantiles,
    probe_limit,
    round_limit,
    start_search,
)


@message("ppf_robust.pooled_counts")
class PooledCounts(Message):
    """n_g per feature, decrypted collectively (Algorithm 3, line 12)."""

    count: np.ndarray


@message("ppf_robust.encrypted_counts")
class EncryptedCounts(Message):
    """A party's counts (per feature, or per probe), encrypted under the joint key."""

    counts: openfhe.Ciphertext
    width: int


async def pooled_counts(crypto: ServerCrypto, width: int | None = None) -> np.ndarray:
    """Server: add every party's encrypted counts, decrypt the sum, round to integers.

    ``width`` None: the first party's width, which every other party must match.
    """
    replies = await crypto.rc.gather(EncryptedCounts)
    width = width if width is not None else replies[crypto.rc.parties[0]].width
    for party, reply in replies.items():
        if reply.width != width:
            raise ProtocolError(f"party {party} sent {reply.width} counts, expected {width}")
    total = await crypto.add_all({p: r.counts for p, r in replies.items()})
    return np.rint(await crypto.decrypt_sum(total, width))


class EncryptedCountAggregator:
    """The k-th search's counts, pooled under encryption (one decryption per round)."""

    def __init__(self, crypto: ServerCrypto | PartyCrypto) -> None:
        self._crypto = crypto
        self._decryptions_owed = 0

    async def pooled(self, ctx: RoleContext, width: int) -> np.ndarray:
        assert isinstance(self._crypto, ServerCrypto)
        return await pooled_counts(self._crypto, width)

    async def contribute(self, ctx: RoleContext, counts: np.ndarray) -> None:
        assert isinstance(self._crypto, PartyCrypto)
        ct = await self._crypto.encrypt_for_sum(counts)
        await ctx.send(SERVER, EncryptedCounts(counts=ct, width=len(counts)))
        self._decryptions_owed = 1

    async def next_probe(self, ctx: RoleContext) -> RankProbe | RankDone:
        assert isinstance(self._crypto, PartyCrypto)
        owed, self._decryptions_owed = self._decryptions_owed, 0
        return await serve_until(self._crypto, (RankProbe, RankDone), decryptions=0,
                                 sums=owed)


async def server(rc: RoleContext, options: FitOptions) -> RobustNormalizer:
    crypto = await setup_server(rc, options.preset, **ppf_minmax.setup_arguments(options))
    count = await pooled_counts(crypto)
    width = len(count)
    await rc.broadcast(PooledCounts(count=count))
    low, high = await ppf_minmax.minmax_server(crypto, width, options)
    plan = plan_quantiles(count, QUARTILES, options.quantile_rule)
    search = start_search(plan, count, low, high, options, max_points=crypto.ckks.slots)
    values = await kth_server(rc, search, EncryptedCountAggregator(crypto))
    quartiles = plan.combine(values)
    quartiles[:, count == 0] = np.nan
    await rc.broadcast(RobustResult(q1=quartiles[0], median=quartiles[1], q3=quartiles[2]))
    return RobustNormalizer(q1=quartiles[0], median=quartiles[1], q3=quartiles[2])


async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> RobustNormalizer:
    X = ppf_minmax.check_minmax_input(check_party_data(X), options)
    crypto = await setup_party(rc, options.preset, **ppf_minmax.setup_arguments(options),
                               flooding_bits=options.flooding_bits)
    width = X.shape[1]
    await rc.send(SERVER, EncryptedCounts(
        counts=await crypto.encrypt_for_sum(feature_counts(X)), width=width))
    await serve_until(crypto, PooledCounts, decryptions=0, sums=1)
    low, high = await ppf_minmax.minmax_party(crypto, X, options)
    columns = SortedColumns(X, probe_limit(options, QUARTILES), bounds=(low, high),
                            max_rounds=round_limit(low, high, options))
    await kth_party(rc, columns, EncryptedCountAggregator(crypto))
    result = await rc.receive(SERVER, RobustResult)
    return RobustNormalizer(q1=as_float_vector(result.q1, width, "q1"),
                            median=as_float_vector(result.median, width, "median"),
                            q3=as_float_vector(result.q3, width, "q3"))


register("robust", "mhe", server, party)
