"""Federated z-score: pooled per-feature mean and population variance.

Plaintext counterpart of the paper's Algorithm 1, with the same two rounds:
parties send per-feature sums and counts, the server returns the global mean,
parties send sums of squared deviations from it, the server returns the variance.
The second round also carries the sum of plain deviations, so the server can apply
the corrected two-pass formula ``(Σd² − (Σd)²/n) / n``: it stays exact when the
values are huge and their spread tiny (1e9 ± 1e-3), where Σx² − n·μ² would not.
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
from fednorm.protocols.normalizers import ZScoreNormalizer

LEDGER = declare("zscore", "plain", {
    "zscore.local_sums": ("count", "total"),
    "zscore.global_mean": ("mean",),
    "zscore.local_deviations": ("squared", "linear"),
    "zscore.result": ("mean", "var", "count"),
})


@message("zscore.local_sums")
class LocalSums(Message):
    count: np.ndarray
    total: np.ndarray


@message("zscore.global_mean")
class GlobalMean(Message):
    mean: np.ndarray


@message("zscore.local_deviations")
class LocalDeviations(Message):
    squared: np.ndarray
    linear: np.ndarray


@message("zscore.result")
class ZScoreResult(Message):
    mean: np.ndarray
    var: np.ndarray
    count: np.ndarray


def _mean(total: np.ndarray, count: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def deviation_sums(X: np.ndarray, mean: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Σ(x−μ)² and Σ(x−μ) per feature, NaN-aware."""
    deviations = X - mean
    return np.nansum(deviations**2, axis=0), np.nansum(deviations, axis=0)


def corrected_variance(
    count: np.ndarray, squared: np.ndarray, linear: np.ndarray
) -> np.ndarray:
    """Population variance by the corrected two-pass formula; NaN where no data."""
    safe = np.maximum(count, 1)
    var = (squared - linear**2 / safe) / safe
    return np.where(count > 0, np.maximum(var, 0.0), np.nan)


async def server(ctx: RoleContext, options: FitOptions) -> ZScoreNormalizer:
    sums = await ctx.gather(LocalSums)
    count = gathered_vectors(sums, "count").sum(axis=0)
    total = gathered_vectors(sums, "total", len(count)).sum(axis=0)
    mean = _mean(total, count)
    await ctx.broadcast(GlobalMean(mean=mean))

    deviations = await ctx.gather(LocalDeviations)
    squared = gathered_vectors(deviations, "squared", len(count)).sum(axis=0)
    linear = gathered_vectors(deviations, "linear", len(count)).sum(axis=0)
    result = ZScoreResult(
        mean=mean + _mean(linear, count), var=corrected_variance(count, squared, linear),
        count=count,
    )
    await ctx.broadcast(result)
    return ZScoreNormalizer(result.mean, result.var, count)


async def party(ctx: RoleContext, X: np.ndarray, options: FitOptions) -> ZScoreNormalizer:
    await ctx.send(SERVER, LocalSums(count=feature_counts(X), total=np.nansum(X, axis=0)))
    mean = (await ctx.receive(SERVER, GlobalMean)).mean
    squared, linear = deviation_sums(X, mean)
    await ctx.send(SERVER, LocalDeviations(squared=squared, linear=linear))
    result = await ctx.receive(SERVER, ZScoreResult)
    return ZScoreNormalizer(result.mean, result.var, result.count)


def fit_local(X: np.ndarray, options: FitOptions) -> ZScoreNormalizer:
    count = feature_counts(X)
    mean = _mean(np.nansum(X, axis=0), count)
    squared, linear = deviation_sums(X, mean)
    return ZScoreNormalizer(mean + _mean(linear, count),
                            corrected_variance(count, squared, linear), count)


register("zscore", "plain", Kind(server, party))
register_local("zscore", fit_local)
