"""Federated robust scaling: pooled Q1, median and Q3 (paper Algorithm 3, plaintext).

Round 1 gives the server each feature's pooled count and range; then the k-th
ranked element search (:mod:`fednorm.protocols.plain.kth`) finds the order
statistics around each quartile position, and the quartiles are interpolated
from them as scikit-learn's ``RobustScaler`` does.
"""

from __future__ import annotations

import numpy as np

from fednorm.engine.messages import Message, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.base import (
    FitOptions,
    Kind,
    feature_counts,
    gathered_vectors,
    register,
    register_local,
)
from fednorm.protocols.ledger import declare
from fednorm.protocols.normalizers import RobustNormalizer
from fednorm.protocols.plain import kth
from fednorm.protocols.plain.minmax import local_extremes
from fednorm.protocols.quantiles import plan_quantiles
from fednorm.protocols.rank import SortedColumns, probe_limit, start_search
from fednorm.protocols.rank_rounds import options_probes

QUARTILES = (0.25, 0.5, 0.75)

LEDGER = declare("robust", "plain", {
    "robust.local_summary": ("count", "min", "max"),
    **kth.PLAINTEXT,
    "robust.result": ("q1", "median", "q3"),
})


@message("robust.local_summary")
class LocalSummary(Message):
    count: np.ndarray
    min: np.ndarray
    max: np.ndarray


@message("robust.result")
class RobustResult(Message):
    q1: np.ndarray
    median: np.ndarray
    q3: np.ndarray


def _normalizer(quartiles: np.ndarray) -> RobustNormalizer:
    return RobustNormalizer(q1=quartiles[0], median=quartiles[1], q3=quartiles[2])


async def server(ctx: RoleContext, options: FitOptions) -> RobustNormalizer:
    summaries = await ctx.gather(LocalSummary)
    count = gathered_vectors(summaries, "count").sum(axis=0)
    low = gathered_vectors(summaries, "min", len(count)).min(axis=0)
    high = gathered_vectors(summaries, "max", len(count)).max(axis=0)
    plan = plan_quantiles(count, QUARTILES, options.quantile_rule)
    search = start_search(plan, count, low, high, options)
    values = await kth.kth_server(ctx, search)
    quartiles = plan.combine(values)
    quartiles[:, count == 0] = np.nan
    result = RobustResult(q1=quartiles[0], median=quartiles[1], q3=quartiles[2])
    await ctx.broadcast(result)
    return _normalizer(quartiles)


async def party(ctx: RoleContext, X: np.ndarray, options: FitOptions) -> RobustNormalizer:
    low, high = local_extremes(X)
    await ctx.send(SERVER, LocalSummary(count=feature_counts(X), min=low, max=high))
    await kth.kth_party(ctx, SortedColumns(X, probe_limit(options_probes(options), QUARTILES)))
    result = await ctx.receive(SERVER, RobustResult)
    return _normalizer(np.vstack([result.q1, result.median, result.q3]))


def fit_local(X: np.ndarray, options: FitOptions) -> RobustNormalizer:
    """Exact local quartiles (numpy's linear interpolation, as RobustScaler)."""
    count = feature_counts(X)
    quartiles = np.full((3, X.shape[1]), np.nan)
    present = count > 0
    if present.any():
        quartiles[:, present] = np.nanpercentile(X[:, present], [25, 50, 75], axis=0)
    return _normalizer(quartiles)


register("robust", "plain", Kind(server, party))
register_local("robust", fit_local)
