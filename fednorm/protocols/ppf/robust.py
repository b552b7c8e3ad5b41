"""PPF robust scaling (paper Algorithm 3) on the PPF k-th ranked element (Algorithm 4).

**Default algorithm** (``FitOptions.algorithm="default"``): Algorithm 3 without its MinMax
pre-pass.  The search (:mod:`fednorm.protocols.rank`) cuts brackets in the total order of
float64 values, so it needs no extremes to start from: every bracket starts as the whole
float order and ends on one float — exact order statistics, with no V_abs, no comparison
polynomial and no bootstrap; every decryption is a flooded sum of the parties' signed
count uploads (n_g with the first search round's counts, at an opening probe every role
computes alone, :func:`~fednorm.protocols.rank.opening_probe`; then one per round).  An
absolute ``epsilon`` stops a target once its bracket is that narrow (``relative_epsilon``
has no range to apply to).  Each round probes ``rank_probes`` points per target
(default: as many counts as one ciphertext holds, packed several to a slot once n_g
bounds them, :class:`~fednorm.protocols.ppf.pooled.CountPacking`; at most 255), so a
target takes at most ⌈64 / log2(K + 1)⌉ rounds and reveals K pooled counts a round; a
party refuses more points per feature (:func:`~fednorm.protocols.rank.probe_limit`) or
more rounds (:func:`~fednorm.protocols.rank_rounds.unbounded_round_limit`).

**Paper algorithm**, step by step with Algorithm 3:

1. collective key generation (line 1);
2. each party encrypts its per-feature counts n_p (lines 2–8); the server adds them and
   the parties decrypt the pooled counts n_g collectively (lines 10–12);
3. the quartile ranks follow from n_g (lines 13–17; :func:`~fednorm.protocols.rank.plan_quantiles`,
   with the interpolation of scikit-learn's ``RobustScaler`` or the paper's gap rule);
4. PPF MinMax gives the search bounds (lines 18–19), widened by its public error bound
   (:func:`search_bracket`), so a quartile on the pooled min or max stays inside;
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

from fednorm.engine import ckks
from fednorm.engine.messages import as_float_vector
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.base import (
    MAX_RANK_PROBES,
    FitOptions,
    feature_counts,
)
from fednorm.protocols.collective import flooding_arguments, setup_party, setup_server
from fednorm.protocols.ledger import COLLECTIVE, Allowance, declare
from fednorm.protocols.normalizers import RobustNormalizer
from fednorm.protocols.plain.robust import QUARTILES, RobustResult
from fednorm.protocols.ppf import kth
from fednorm.protocols.ppf import minmax as ppf_minmax
from fednorm.protocols.ppf.checks import vabs_vector
from fednorm.protocols.ppf.minmax_layout import error_bound
from fednorm.protocols.quantiles import QuantilePlan, plan_quantiles
from fednorm.protocols.rank import (
    SortedColumns,
    probe_limit,
    search_probes,
    start_search,
    start_unbounded_search,
)
from fednorm.protocols.rank_rounds import options_probes, round_limit, unbounded_round_limit

LEDGER = declare(
    "robust", "mhe",
    {**COLLECTIVE, **kth.PLAINTEXT, **kth.OPENING_PLAINTEXT,
     "robust.result": ("q1", "median", "q3")},
)
"""Allowances: :data:`~.kth.POOLED_COUNT` (n_g with the counts at the opening probe),
then :data:`~.kth.SEARCH_ROUND` per round."""

PAPER_LEDGER = declare(
    "robust", "mhe",
    {**COLLECTIVE, **kth.PLAINTEXT, **ppf_minmax.PLAINTEXT,
     "robust.result": ("q1", "median", "q3")},
    algorithm="paper",
)
"""Allowances: :data:`~.kth.POOLED_COUNT`, then PPF MinMax's :data:`~.minmax.PASS`,
then :data:`~.kth.SEARCH_ROUND` per round."""


def setup_arguments(options: FitOptions) -> dict[str, object]:
    """The default algorithm only adds counts: no relinearization key, no rotation."""
    return {"relinearize": False}


# -- default: the search from the whole float order ----------------------------------
def default_probes(plan: QuantilePlan, options: FitOptions, capacity: int) -> int:
    """Points per target and round: ``rank_probes``, else as many as fit one ciphertext
    (``capacity`` counts: :func:`~.kth.probe_capacity`)."""
    return search_probes(options, len(plan.features), capacity, default=MAX_RANK_PROBES)


def flooded_decryptions(options: FitOptions, width: int) -> Allowance:
    """The most flooded decryptions of a run on ``width`` features: n_g with the opening's
    counts, then the rounds a party allows at the fewest points per target a round can
    probe (unpacked counts, every feature with two targets per quartile)."""
    slots = ckks.get_preset(options.preset).slots
    fewest = search_probes(options, probe_limit(1, QUARTILES) * width, slots,
                           default=MAX_RANK_PROBES)
    return kth.POOLED_COUNT + kth.SEARCH_ROUND.times(unbounded_round_limit(fewest))


async def server(rc: RoleContext, options: FitOptions) -> RobustNormalizer:
    crypto = await setup_server(rc, options.preset, **setup_arguments(options))
    count, opening, at_opening = await kth.reveal_counts_and_opening(crypto, options,
                                                                     QUARTILES)
    plan = plan_quantiles(count, QUARTILES, options.quantile_rule)
    probes = default_probes(plan, options, kth.probe_capacity(crypto, count))
    search = start_unbounded_search(plan, count, options, probes)
    search.narrow(opening, at_opening)
    return await _finish_server(rc, plan, count, await kth.kth_server(crypto, search, count))


async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> RobustNormalizer:
    crypto = await setup_party(rc, options.preset, **setup_arguments(options),
                               **flooding_arguments(options))
    # The opening (this party's own probe) is the search's first round: it counts.
    columns = SortedColumns(X, probe_limit(MAX_RANK_PROBES, QUARTILES), max_rounds=1)
    count = await kth.share_counts_and_opening(crypto, X, columns, options, QUARTILES)
    plan = plan_quantiles(np.asarray(count, dtype=np.float64), QUARTILES,
                          options.quantile_rule)
    probes = default_probes(plan, options, kth.probe_capacity(crypto, count))
    columns.agree(probe_limit(probes, QUARTILES), unbounded_round_limit(probes))
    await kth.kth_party(crypto, columns, count)
    return await _finish_party(rc, X.shape[1])


async def _finish_server(rc: RoleContext, plan: QuantilePlan, count: np.ndarray,
                         values: np.ndarray) -> RobustNormalizer:
    """Lines 25–26: the quartiles from the found order statistics, broadcast."""
    quartiles = plan.combine(values)
    quartiles[:, count == 0] = np.nan
    await rc.broadcast(RobustResult(q1=quartiles[0], median=quartiles[1], q3=quartiles[2]))
    return RobustNormalizer(q1=quartiles[0], median=quartiles[1], q3=quartiles[2])


async def _finish_party(rc: RoleContext, width: int) -> RobustNormalizer:
    result = await rc.receive(SERVER, RobustResult)
    return RobustNormalizer(q1=as_float_vector(result.q1, width, "q1"),
                            median=as_float_vector(result.median, width, "median"),
                            q3=as_float_vector(result.q3, width, "q3"))


# -- paper: Algorithm 3 on PPF MinMax's extremes ---------------------------------------
async def paper_server(rc: RoleContext, options: FitOptions) -> RobustNormalizer:
    crypto = await setup_server(rc, options.preset, **ppf_minmax.setup_arguments(options))
    count = await kth.reveal_pooled_counts(crypto)
    low, high = search_bracket(await ppf_minmax.minmax_server(crypto, len(count), options),
                               options, len(rc.parties))
    plan = plan_quantiles(count, QUARTILES, options.quantile_rule)
    search = start_search(plan, count, low, high, options,
                          max_points=kth.probe_capacity(crypto, count))
    return await _finish_server(rc, plan, count, await kth.kth_server(crypto, search, count))


async def paper_party(rc: RoleContext, X: np.ndarray, options: FitOptions
                      ) -> RobustNormalizer:
    X = ppf_minmax.check_minmax_input(X, options)
    crypto = await setup_party(rc, options.preset, **ppf_minmax.setup_arguments(options),
                               **flooding_arguments(options))
    width = X.shape[1]
    count = await kth.share_pooled_counts(crypto, feature_counts(X))
    low, high = search_bracket(await ppf_minmax.minmax_party(crypto, X, options), options,
                               crypto.n_parties)
    columns = SortedColumns(X, probe_limit(options_probes(options), QUARTILES), bounds=(low, high),
                            max_rounds=round_limit(low, high, options))
    await kth.kth_party(crypto, columns, count)
    return await _finish_party(rc, width)


def search_bracket(extremes: tuple[np.ndarray, np.ndarray], options: FitOptions,
                   parties: int) -> tuple[np.ndarray, np.ndarray]:
    """Where the k-th search starts: PPF MinMax's (min, max) widened by its error bound
    (public: V_abs, the passes, P and the flooding), so that a quartile on the pooled
    min or max (ties) lies inside the bracket; every role computes the same bracket."""
    low, high = extremes
    margin = error_bound(options, parties) * vabs_vector(options, len(low))
    return low - margin, high + margin

