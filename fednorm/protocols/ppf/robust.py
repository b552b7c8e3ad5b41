"""PPF robust scaling (paper Algorithm 3) on the PPF k-th ranked element (Algorithm 4).

Step by step with Algorithm 3:

1. collective key generation (line 1);
2. each party encrypts its per-feature counts n_p (lines 2–8); the server adds them and
   the parties decrypt the pooled counts n_g collectively (lines 10–12);
3. the quartile ranks follow from n_g (lines 13–17; :func:`~fednorm.protocols.rank.plan_quantiles`,
   with the interpolation of scikit-learn's ``RobustScaler`` or the paper's gap rule);
4. PPF MinMax gives the search bounds (lines 18–19);
5. the k-th element search (Algorithm 4, :mod:`fednorm.protocols.ppf.kth`): each round
   the server sends midpoints, every party encrypts its counts of values ≤ each
   midpoint, the server adds the ciphertexts and the pooled counts are decrypted
   collectively; all features and all ranks share one ciphertext per round (lines 20–24);
6. the quartiles are broadcast and each party scales locally (lines 25–26).

Revealed: n_g, the global min and max, each round's midpoints and the pooled counts at
them (the "> M" count is n_g − L and is never sent), and Q1, median, Q3.
"""

from __future__ import annotations

import numpy as np

from fednorm.engine.messages import as_float_vector
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.base import FitOptions, check_party_data, feature_counts
from fednorm.protocols.collective import flooding_arguments, setup_party, setup_server
from fednorm.protocols.ledger import COLLECTIVE, declare
from fednorm.protocols.normalizers import RobustNormalizer
from fednorm.protocols.plain.robust import QUARTILES, RobustResult
from fednorm.protocols.ppf import kth
from fednorm.protocols.ppf import minmax as ppf_minmax
from fednorm.protocols.rank import (
    SortedColumns,
    plan_quantiles,
    probe_limit,
    round_limit,
    start_search,
)

PAPER_LEDGER = declare(
    "robust", "mhe",
    {**COLLECTIVE, **kth.PLAINTEXT, **ppf_minmax.PLAINTEXT,
     "robust.result": ("q1", "median", "q3")},
    algorithm="paper",
)
"""Allowances: :data:`~.kth.POOLED_COUNT`, then PPF MinMax's :data:`~.minmax.PASS`,
then :data:`~.kth.SEARCH_ROUND` per round."""


async def server(rc: RoleContext, options: FitOptions) -> RobustNormalizer:
    crypto = await setup_server(rc, options.preset, **ppf_minmax.setup_arguments(options))
    count = await kth.reveal_pooled_counts(crypto)
    low, high = await ppf_minmax.minmax_server(crypto, len(count), options)
    plan = plan_quantiles(count, QUARTILES, options.quantile_rule)
    search = start_search(plan, count, low, high, options, max_points=crypto.ckks.slots)
    quartiles = plan.combine(await kth.kth_server(crypto, search))
    quartiles[:, count == 0] = np.nan
    await rc.broadcast(RobustResult(q1=quartiles[0], median=quartiles[1], q3=quartiles[2]))
    return RobustNormalizer(q1=quartiles[0], median=quartiles[1], q3=quartiles[2])


async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> RobustNormalizer:
    X = ppf_minmax.check_minmax_input(check_party_data(X), options)
    crypto = await setup_party(rc, options.preset, **ppf_minmax.setup_arguments(options),
                               **flooding_arguments(options))
    width = X.shape[1]
    await kth.share_pooled_counts(crypto, feature_counts(X))
    low, high = await ppf_minmax.minmax_party(crypto, X, options)
    columns = SortedColumns(X, probe_limit(options, QUARTILES), bounds=(low, high),
                            max_rounds=round_limit(low, high, options))
    await kth.kth_party(crypto, columns)
    result = await rc.receive(SERVER, RobustResult)
    return RobustNormalizer(q1=as_float_vector(result.q1, width, "q1"),
                            median=as_float_vector(result.median, width, "median"),
                            q3=as_float_vector(result.q3, width, "q3"))

