"""Federated MinMax: pooled per-feature minimum and maximum in one round.

Each party sends its local minima and maxima (±inf for a feature it has no
values of), the server keeps the extremes.  This reveals every party's local
extremes to the server, which is exactly what PPF MinMax avoids.
"""

from __future__ import annotations

import numpy as np

from fednorm.engine.messages import Message, message
from fednorm.engine.runtime import SERVER, RoleContext
from fednorm.protocols.base import (
    FitOptions,
    Kind,
    gathered_vectors,
    register,
    register_local,
)
from fednorm.protocols.ledger import declare
from fednorm.protocols.normalizers import MinMaxNormalizer

LEDGER = declare("minmax", "plain", {
    "minmax.local_extremes": ("min", "max"),
    "minmax.result": ("min", "max"),
})


@message("minmax.local_extremes")
class LocalExtremes(Message):
    min: np.ndarray
    max: np.ndarray


@message("minmax.result")
class MinMaxResult(Message):
    min: np.ndarray
    max: np.ndarray


def local_extremes(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature min and max, +inf / -inf where a feature has no values."""
    present = ~np.isnan(X)
    low = np.where(present, X, np.inf).min(axis=0, initial=np.inf)
    high = np.where(present, X, -np.inf).max(axis=0, initial=-np.inf)
    return low, high


def finite_or_nan(values: np.ndarray) -> np.ndarray:
    """Turn the ±inf of 'no values at all' into NaN for the result."""
    return np.where(np.isfinite(values), values, np.nan)


async def server(ctx: RoleContext, options: FitOptions) -> MinMaxNormalizer:
    extremes = await ctx.gather(LocalExtremes)
    low = gathered_vectors(extremes, "min").min(axis=0)
    high = gathered_vectors(extremes, "max", len(low)).max(axis=0)
    result = MinMaxResult(min=finite_or_nan(low), max=finite_or_nan(high))
    await ctx.broadcast(result)
    return MinMaxNormalizer(result.min, result.max)


async def party(ctx: RoleContext, X: np.ndarray, options: FitOptions) -> MinMaxNormalizer:
    low, high = local_extremes(X)
    await ctx.send(SERVER, LocalExtremes(min=low, max=high))
    result = await ctx.receive(SERVER, MinMaxResult)
    return MinMaxNormalizer(result.min, result.max)


def fit_local(X: np.ndarray, options: FitOptions) -> MinMaxNormalizer:
    low, high = local_extremes(X)
    return MinMaxNormalizer(finite_or_nan(low), finite_or_nan(high), rows=X.shape[0])


register("minmax", "plain", Kind(server, party))
register_local("minmax", fit_local)
