"""PPF Yeo-Johnson, the default algorithm: the plain protocol's λ search on flooded sums.

The plain protocol (:mod:`fednorm.protocols.plain.yeojohnson`) pools, per feature, a few
statistics and, per probed λ, the mean and variance of yj(x, λ); here every one of them is a
flooded pooled sum (:mod:`.pooled`), so the server learns the pooled statistics and the
pooled moments at its probes, nothing per party, and no decryption is of anything but a
sum of the parties' signed uploads.  Step by step:

1. the exact pooled min and max of every feature (:mod:`.extremes`, encrypted bits);
   M = max(|min|, |max|) is public from then on;
2. one pooled sum of, per feature, the count n_g, the number of negative values, the
   λ-linear term Σ sign(x)·log1p|x| of the log-likelihood and Σ x/M; the server broadcasts
   the mean μ of x/M, and a second pooled sum gives Σ(x/M − μ)²: the variance for
   scikit-learn's constant-feature test, centered so that nothing cancels;
3. the λ search of the plain protocol (:class:`~fednorm.protocols.plain.yeojohnson.
   LambdaSearch`, the same candidates in asinh(λ), the same scores): each round, for
   every (feature, candidate), a pooled sum of Σ yj(x, λ)/B gives the mean ȳ, which the
   server broadcasts, and a pooled sum of Σ((yj(x, λ) − ȳ)/D)² gives the variance.  B and
   D are public bounds (yj is increasing in x, so over [min, max] |yj| is at most B =
   max(|yj(min)|, |yj(max)|) and |yj − ȳ| at most D = max(yj(max) − ȳ, ȳ − yj(min))):
   every uploaded value is at most 1 in magnitude, so the flooding noise, fixed in the
   units of the sum, is relative to the spread of yj(x, λ) itself, however nearly
   constant the transformed feature (each party adds its own M2 and n_p·(mean_p − ȳ)²,
   both non-negative: Chan's merge under encryption);
4. λ is broadcast and the default PPF z-score runs on the transformed data.

**Right or refused.**  The noise of a flooded sum is known (its σ per slot, from
:class:`~fednorm.engine.ckks.Flooding`); where 8σ of it could move the chosen λ's
log-likelihood by more than :data:`LLF_TOLERANCE` of its value, the run stops with an
error naming the feature instead of returning a λ it cannot vouch for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.messages import Message, as_float_vector, message
from fednorm.engine.runtime import RoleContext
from fednorm.protocols.base import FitOptions, check_party_data, feature_counts
from fednorm.protocols.collective import (
    PartyCrypto,
    ServerCrypto,
    flooding_arguments,
    setup_party,
    setup_server,
)
from fednorm.protocols.ledger import COLLECTIVE, declare
from fednorm.protocols.normalizers import YeoJohnsonNormalizer, yeo_johnson
from fednorm.protocols.plain.yeojohnson import (
    Candidates,
    Lambdas,
    LambdaSearch,
    PartyColumns,
)
from fednorm.protocols.plain.yeojohnson_math import (
    MAX_SEARCH_ROUNDS,
    PooledSummary,
    log_likelihood,
    moments_from_logs,
)
from fednorm.protocols.ppf import extremes, pooled
from fednorm.protocols.ppf import zscore as ppf_zscore
from fednorm.protocols.ppf.phases import serve_phase

LLF_TOLERANCE = 1e-9
"""The chosen λ's log-likelihood is within this (relative) of the pooled fit's, or refused."""

TAIL = 8.0  # a flooded sum's noise stays within this many of its σ per slot

LEDGER = declare("yeojohnson", "mhe", {
    **COLLECTIVE, **pooled.PLAINTEXT, **extremes.PLAINTEXT, **ppf_zscore.LEDGER_FIELDS,
    "yeojohnson.candidates": ("features", "lambdas"),
    "ppf_yeojohnson.centers": ("mean",),
    "yeojohnson.lambdas": ("lambdas",),
})
"""Allowances: the extremes' rounds, then one :data:`~.pooled.POOLED_SUM` before every
message of the server (centers, candidates, λ), then the z-score's."""


@message("ppf_yeojohnson.centers")
class Centers(Message):
    """Pooled means the parties center their next upload on: of x/M, or of yj(x, λ) per
    (feature, candidate), row-major."""

    mean: np.ndarray


def setup_arguments(options: FitOptions) -> dict[str, object]:
    """The extremes' keys (their bits are multiplied); the sums need nothing more."""
    return extremes.setup_arguments(options)


# -- public scales ------------------------------------------------------------------------
def value_bound(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """M per feature: max |x| (1 where it is 0 or the feature is empty)."""
    bound = np.fmax(np.abs(low), np.abs(high))
    return np.where(np.isfinite(bound) & (bound > 0), bound, 1.0)


def transform_bounds(low: np.ndarray, high: np.ndarray, lambdas: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """yj(min, λ) and yj(max, λ) per (feature, candidate) of ``lambdas`` (features, grid):
    the range of yj(x, λ), since yj is increasing in x."""
    grid = lambdas.shape[1]
    ends = np.vstack([np.repeat(low, grid), np.repeat(high, grid)])
    y = yeo_johnson(ends, lambdas.ravel())
    return y[0].reshape(lambdas.shape), y[1].reshape(lambdas.shape)


def mean_scale(y_low: np.ndarray, y_high: np.ndarray) -> np.ndarray:
    """B = max |yj(x, λ)| over the feature's range (1 where 0 or not finite)."""
    bound = np.fmax(np.abs(y_low), np.abs(y_high))
    return np.where(np.isfinite(bound) & (bound > 0), bound, 1.0)


def spread_scale(y_low: np.ndarray, y_high: np.ndarray, center: np.ndarray) -> np.ndarray:
    """D = max |yj(x, λ) − ȳ| over the feature's range (1 where 0 or not finite)."""
    with np.errstate(invalid="ignore", over="ignore"):
        bound = np.fmax(y_high - center, center - y_low)
    return np.where(np.isfinite(bound) & (bound > 0), bound, 1.0)


# -- server ------------------------------------------------------------------------------
@dataclass
class ErrorBounds:
    """For every (feature, λ) probed: how far flooding may have moved its variance (the
    last probe of a λ wins; the search never probes one twice)."""

    noise: float  # per decrypted slot of a pooled sum, in its units
    by_feature: dict[int, dict[float, tuple[float, float]]] = field(default_factory=dict)

    def record(self, probe: Candidates, count: np.ndarray, var: np.ndarray,
               mean_scale: np.ndarray, spread_scale: np.ndarray) -> None:
        n = np.maximum(count[probe.features], 1)[:, None]
        # The centered sum's noise is D²·noise/n on the variance; the mean's, B·noise/n,
        # enters it squared.
        moved = spread_scale**2 * self.noise / n + (mean_scale * self.noise / n) ** 2
        for row, j in enumerate(probe.features):
            entries = self.by_feature.setdefault(int(j), {})
            for lam, v, d in zip(probe.lambdas[row], var[row], moved[row], strict=True):
                entries[float(lam)] = (float(v), float(d))

    def unsure(self, search: LambdaSearch, summary: PooledSummary) -> np.ndarray:
        """The searched features whose chosen λ's log-likelihood flooding may have moved by
        more than :data:`LLF_TOLERANCE` of itself."""
        unsure = []
        for j in search.features:
            var, moved = self.by_feature[int(j)][float(search.lambdas[j])]
            n = summary.count[j]
            llf = log_likelihood(np.array(search.lambdas[j]), n, np.array(var),
                                 summary.log_sum[j])
            with np.errstate(all="ignore"):
                error = n / 2 * moved / var
            if not error <= LLF_TOLERANCE * max(abs(float(llf)), 1.0):
                unsure.append(j)
        return np.array(unsure, dtype=np.int64)


async def server(rc: RoleContext, options: FitOptions) -> YeoJohnsonNormalizer:
    crypto = await setup_server(rc, options.preset, **setup_arguments(options))
    low, high = await extremes.extremes_server(crypto, None)
    summary = await _pooled_summary(crypto, low, high)
    search = LambdaSearch(summary)
    bounds = ErrorBounds(pooled.noise_bound(crypto.ckks, len(rc.parties), options))
    while not search.finished:
        probe = search.probe()
        await rc.broadcast(probe)
        search.update(*await _pooled_moments(crypto, probe, low, high, summary.count,
                                             bounds))
    unsure = bounds.unsure(search, summary)
    if len(unsure):
        names = ", ".join(f"feature {j + 1}" for j in unsure)
        raise InputError(f"PPF Yeo-Johnson cannot vouch for the λ of {names}: the flooded "
                         f"sums' noise could move its log-likelihood by more than "
                         f"{LLF_TOLERANCE:g} of itself (the transformed values are too nearly "
                         "constant for the flooding's precision)")
    await rc.broadcast(Lambdas(lambdas=search.lambdas))
    with rc.subprotocol("zscore"):
        scaled = await ppf_zscore.server(rc, ppf_zscore.revealing(options))
    return YeoJohnsonNormalizer(search.lambdas, scaled.mean, scaled.var)


async def _pooled_summary(crypto: ServerCrypto, low: np.ndarray, high: np.ndarray
                          ) -> PooledSummary:
    """Step 2: n_g, #(x < 0), Σ sign(x)·log1p|x|, and the mean and variance of x/M."""
    width = len(low)
    count, negatives, log_sum, scaled_total = np.split(
        await pooled.pooled_sum(crypto, 4 * width), 4)
    count, negatives = np.rint(count), np.rint(negatives)
    present = count > 0
    scaled_mean = np.where(present, scaled_total / np.maximum(count, 1), 0.0)
    await crypto.rc.broadcast(Centers(mean=scaled_mean))
    scaled_m2 = await pooled.pooled_sum(crypto, width)
    with np.errstate(invalid="ignore"):
        max_abs = np.nan_to_num(np.fmax(np.abs(low), np.abs(high)))
    return PooledSummary(count, np.where(present, scaled_mean, np.nan),
                         np.where(present, np.maximum(scaled_m2, 0.0) / np.maximum(count, 1),
                                  np.nan), max_abs, negatives, log_sum)


async def _pooled_moments(crypto: ServerCrypto, probe: Candidates, low: np.ndarray,
                          high: np.ndarray, count: np.ndarray, bounds: ErrorBounds
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Step 3, one round: the pooled mean and variance of yj(x, λ) per candidate."""
    lambdas = probe.lambdas
    y_low, y_high = transform_bounds(low[probe.features], high[probe.features], lambdas)
    n = np.maximum(count[probe.features], 1)[:, None]
    b = mean_scale(y_low, y_high)
    total = (await pooled.pooled_sum(crypto, lambdas.size)).reshape(lambdas.shape)
    mean = b * total / n
    await crypto.rc.broadcast(Centers(mean=mean.ravel()))
    d = spread_scale(y_low, y_high, mean)
    m2 = (await pooled.pooled_sum(crypto, lambdas.size)).reshape(lambdas.shape)
    var = np.maximum(m2, 0.0) * d**2 / n
    bounds.record(probe, count, var, b, d)
    return mean, var


# -- party -------------------------------------------------------------------------------
async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> YeoJohnsonNormalizer:
    X = check_party_data(X)
    crypto = await setup_party(rc, options.preset, **setup_arguments(options),
                               **flooding_arguments(options))
    low, high = await extremes.extremes_party(crypto, X)
    columns = PartyColumns(X)
    count = feature_counts(X)
    await _share_summary(crypto, X, count, value_bound(low, high))
    rounds = 0
    while isinstance(msg := await serve_phase(crypto, (Candidates, Lambdas), pooled.POOLED_SUM),
                     Candidates):
        rounds += 1
        if rounds > MAX_SEARCH_ROUNDS:
            raise ProtocolError(f"the server's λ search exceeds {MAX_SEARCH_ROUNDS} rounds")
        await _share_moments(crypto, columns, msg, count, low, high)
    lambdas = as_float_vector(msg.lambdas, X.shape[1], "Yeo-Johnson lambdas from the server")
    if not np.isfinite(lambdas).all():
        raise ProtocolError("Yeo-Johnson lambdas from the server are not all finite")
    with rc.subprotocol("zscore"):
        scaled = await ppf_zscore.party(rc, yeo_johnson(X, lambdas),
                                        ppf_zscore.revealing(options))
    return YeoJohnsonNormalizer(lambdas, scaled.mean, scaled.var)


async def _share_summary(crypto: PartyCrypto, X: np.ndarray, count: np.ndarray,
                         bound: np.ndarray) -> None:
    """Party side of step 2."""
    scaled = X / bound
    await pooled.send_sum(crypto, np.concatenate([
        count, np.sum(X < 0, axis=0).astype(np.float64),
        np.nansum(np.sign(X) * np.log1p(np.abs(X)), axis=0), np.nansum(scaled, axis=0)]))
    center = await _centers(crypto, X.shape[1])
    await pooled.send_sum(crypto, np.nansum((scaled - center) ** 2, axis=0))


async def _share_moments(crypto: PartyCrypto, columns: PartyColumns, probe: Candidates,
                         count: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
    """Party side of one round of step 3: n_p·mean_p/B, then (M2_p + n_p·(mean_p − ȳ)²)/D²
    per (feature, candidate), from this party's moments of yj(x, λ)."""
    features, lambdas = columns.check(probe)
    mean, m2 = moments_from_logs(columns.logs.select(features), lambdas)
    y_low, y_high = transform_bounds(low[features], high[features], lambdas)
    n = count[features][:, None]
    await pooled.send_sum(crypto, (n * mean / mean_scale(y_low, y_high)).ravel())
    center = (await _centers(crypto, lambdas.size)).reshape(lambdas.shape)
    spread = np.where(n > 0, m2 + n * (mean - center) ** 2, 0.0)
    await pooled.send_sum(crypto, (spread / spread_scale(y_low, y_high, center) ** 2).ravel())


async def _centers(crypto: PartyCrypto, width: int) -> np.ndarray:
    """The server's pooled means (after the decryption of the sum just sent)."""
    centers = await serve_phase(crypto, Centers, pooled.POOLED_SUM)
    mean = as_float_vector(centers.mean, width, "pooled means from the server")
    if not np.isfinite(mean).all():
        raise ProtocolError("pooled means from the server are not all finite")
    return mean
