"""PPF Yeo-Johnson, the default algorithm: the plain protocol's λ search on flooded sums.

The plain protocol (:mod:`fednorm.protocols.plain.yeojohnson`) pools, per feature, a few
statistics and, per probed λ, the mean and variance of yj(x, λ); here every one of them
comes from a flooded pooled sum (:mod:`.pooled`), so the server learns the pooled
statistics and the pooled moments at its probes, nothing per party, and no decryption is
of anything but a sum of the parties' signed uploads.  Step by step:

1. the exact pooled min and max of every feature (:mod:`.extremes`, encrypted bits);
2. one pooled sum of, per feature, the count n_g, the number of negative values, the
   λ-linear term Σ sign(x)·log1p|x| of the log-likelihood, and the first two moments of
   x about the midrange c in units of the half-range h: Σ(x − c)/h and Σ((x − c)/h)²
   (for scikit-learn's constant-feature test; a feature whose min equals its max is
   constant, exactly);
3. the λ search of the plain protocol (:class:`~fednorm.protocols.plain.yeojohnson.
   LambdaSearch`, candidates evenly spread in asinh(λ), the same scores), with
   :func:`search_grid` candidates per feature after the first round: each round one
   pooled sum of the same two moments of yj(x, λ) for every (feature, candidate), about
   the midrange of yj over [min, max] in units of its half-range (yj is increasing in x,
   so these are public: yj(min, λ) and yj(max, λ)).  Every uploaded value is then at most
   n_p in magnitude, and the flooding noise, fixed in the units of the sum, is relative
   to the spread of yj(x, λ) itself.  A party adds its own M2 and n_p·(mean_p − c)², both
   non-negative (Chan's merge under encryption); the server's variance
   h²·(S2/n − (S1/n)²) cancels at most as much as the mean lies off the midrange;
4. λ is broadcast with the pooled mean and variance of yj(x, λ) at it, which the search
   has already decrypted (λ is always a probed candidate; λ = 1, the identity, for a
   constant feature, whose moments step 2 gave): no further round, and no bound on the
   transformed values.

**Right or refused.**  The noise of a flooded sum is bounded (8σ per slot of
:class:`~fednorm.engine.ckks.Flooding`, :func:`.pooled.noise_bound`); where it and the
rounding of that one subtraction could move the chosen λ's log-likelihood by more than
:data:`LLF_TOLERANCE` of its value, the run stops with an error naming the feature
instead of returning a λ it cannot vouch for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fednorm.engine import ckks
from fednorm.engine.errors import InputError, ProtocolError
from fednorm.engine.messages import Message, as_float_vector, message
from fednorm.engine.runtime import RoleContext
from fednorm.protocols.base import FitOptions, feature_counts
from fednorm.protocols.collective import (
    ServerCrypto,
    flooding_arguments,
    setup_party,
    setup_server,
)
from fednorm.protocols.ledger import COLLECTIVE, Allowance, declare
from fednorm.protocols.normalizers import YeoJohnsonNormalizer, yeo_johnson
from fednorm.protocols.plain.yeojohnson import (
    Candidates,
    LambdaSearch,
    PartyColumns,
)
from fednorm.protocols.plain.yeojohnson_math import (
    FIRST_GRID,
    GRID,
    LAMBDA_CAP,
    PooledSummary,
    log_likelihood,
    moments_from_logs,
    search_rounds,
)
from fednorm.protocols.ppf import extremes, pooled
from fednorm.protocols.ppf.phases import serve_phase

LLF_TOLERANCE = 1e-9
"""The chosen λ's log-likelihood is within this (relative) of the pooled fit's, or refused."""

LEDGER = declare("yeojohnson", "mhe", {
    **COLLECTIVE, **pooled.PLAINTEXT, **extremes.PLAINTEXT,
    "yeojohnson.candidates": ("features", "lambdas"),
    "ppf_yeojohnson_sums.result": ("lambdas", "mean", "var"),
})
"""Allowances: the extremes' rounds, then one :data:`~.pooled.POOLED_SUM` before every
message of the server (candidates, the result)."""


SEARCH_GRID = 30
"""Candidates per feature in every λ round after the first, where the plain search
probes :data:`~fednorm.protocols.plain.yeojohnson_math.GRID` = 6: a round narrows the
bracket (30 + 1)/2 = 15.5 times instead of 3.5, so the search takes about half the
rounds (each a flooded decryption of the keys' budget and a round trip) and reveals
about twice the pooled moments."""


def search_grid(options: FitOptions, width: int) -> int:
    """Candidates per feature after the first round: :data:`SEARCH_GRID`, fewer where one
    sum upload's slots cannot hold two values per candidate of ``width`` features, never
    fewer than the plain search's."""
    slots = ckks.get_preset(options.preset).slots
    return max(GRID, min(SEARCH_GRID, slots // (2 * max(width, 1))))


def search_round_limit(grid: int) -> int:
    """The most λ rounds a search of ``grid`` candidates takes, whatever the data (its
    bracket from −λ cap to +λ cap), and so the most a party allows."""
    return search_rounds(2 * math.asinh(LAMBDA_CAP), grid)


def flooded_decryptions(options: FitOptions, width: int) -> Allowance:
    """The most flooded decryptions of a run: the extremes' search, the summary's sum,
    and one sum per λ round, for as many rounds as a party allows."""
    rounds = search_round_limit(search_grid(options, width))
    return extremes.flooded_decryptions(options, width) + pooled.POOLED_SUM.times(1 + rounds)


@message("ppf_yeojohnson_sums.result")
class PpfYeoJohnsonResult(Message):
    """λ per feature, and the pooled mean and variance of yj(x, λ) at it."""

    lambdas: np.ndarray
    mean: np.ndarray
    var: np.ndarray


def setup_arguments(options: FitOptions) -> dict[str, object]:
    """The extremes' keys (their bits are multiplied); the sums need nothing more."""
    return extremes.setup_arguments(options)


# -- public scales ------------------------------------------------------------------------
def midrange(low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The center c and half-width h of [low, high] (no overflow; h = 1 where the range
    is empty, a single value or not finite, and c = 0 where not finite)."""
    with np.errstate(invalid="ignore", over="ignore"):
        center, half = low / 2 + high / 2, high / 2 - low / 2
    usable = np.isfinite(half) & (half > 0)
    return np.where(np.isfinite(center), center, 0.0), np.where(usable, half, 1.0)


def transform_bounds(low: np.ndarray, high: np.ndarray, lambdas: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """yj(min, λ) and yj(max, λ) per (feature, candidate) of ``lambdas`` (features, grid):
    the range of yj(x, λ), since yj is increasing in x."""
    grid = lambdas.shape[1]
    ends = np.vstack([np.repeat(low, grid), np.repeat(high, grid)])
    y = yeo_johnson(ends, lambdas.ravel())
    return y[0].reshape(lambdas.shape), y[1].reshape(lambdas.shape)


def party_moments(count: np.ndarray, mean: np.ndarray, m2: np.ndarray, center: np.ndarray,
                  half: np.ndarray) -> np.ndarray:
    """A party's (n_p·(mean_p − c)/h, (M2_p + n_p·(mean_p − c)²)/h²), stacked."""
    with np.errstate(invalid="ignore", over="ignore"):
        offset = np.where(count > 0, (mean - center) / half, 0.0)
        return np.stack([count * offset, np.where(count > 0, m2 / half**2, 0.0)
                         + count * offset**2])


def pooled_moments(sums: np.ndarray, count: np.ndarray, center: np.ndarray,
                   half: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pooled mean and population variance from the pooled :func:`party_moments`, and
    the first moment about c in units of h (what the variance's rounding depends on)."""
    n = np.maximum(count, 1)
    first, second = sums[0] / n, sums[1] / n
    return center + half * first, half**2 * np.maximum(second - first**2, 0.0), first


# -- server ------------------------------------------------------------------------------
@dataclass
class ProbedMoments:
    """For every (feature, λ) probed: the pooled mean and variance of yj(x, λ), and how far
    flooding and the variance's one subtraction may have moved the variance."""

    noise: float  # per decrypted slot of a pooled sum, in its units
    by_feature: dict[int, dict[float, tuple[float, float, float]]] = field(
        default_factory=dict)

    def record(self, probe: Candidates, count: np.ndarray, mean: np.ndarray, var: np.ndarray,
               half: np.ndarray, first: np.ndarray) -> None:
        n = np.maximum(count[probe.features], 1)[:, None]
        # S2/n and (S1/n)² each carry noise/n (the latter times 2|S1/n|); the subtraction
        # rounds at eps of the larger term.
        moved = half**2 * (self.noise / n * (1 + 2 * np.abs(first))
                           + 4 * np.finfo(np.float64).eps * (first**2 + var / half**2))
        for row, j in enumerate(probe.features):
            entries = self.by_feature.setdefault(int(j), {})
            for lam, m, v, d in zip(probe.lambdas[row], mean[row], var[row], moved[row],
                                    strict=True):
                entries[float(lam)] = (float(m), float(v), float(d))

    def at(self, feature: int, lam: float) -> tuple[float, float, float]:
        """(mean, variance, how far the variance may be off) at a probed λ."""
        return self.by_feature[feature][float(lam)]

    def unsure(self, search: LambdaSearch, summary: PooledSummary) -> np.ndarray:
        """The searched features whose chosen λ's log-likelihood flooding and rounding may
        have moved by more than :data:`LLF_TOLERANCE` of itself."""
        unsure = []
        for j in search.features:
            _, var, moved = self.at(int(j), search.lambdas[j])
            n = summary.count[j]
            llf = log_likelihood(np.array(search.lambdas[j]), n, np.array(var),
                                 summary.log_sum[j])
            with np.errstate(all="ignore"):
                error = n / 2 * moved / var
            if not error <= LLF_TOLERANCE * max(abs(float(llf)), 1.0):
                unsure.append(j)
        return np.array(unsure, dtype=np.int64)

    def chosen(self, search: LambdaSearch, identity: tuple[np.ndarray, np.ndarray]
               ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of yj(x, λ) at every feature's λ: the probed ones, and for the
        features never searched (λ = 1: yj is the identity) ``identity``'s."""
        mean, var = (np.array(a, dtype=np.float64) for a in identity)
        for j in search.features:
            mean[j], var[j], _ = self.at(int(j), search.lambdas[j])
        return mean, var


async def server(rc: RoleContext, options: FitOptions) -> YeoJohnsonNormalizer:
    crypto = await setup_server(rc, options.preset, **setup_arguments(options))
    low, high = await extremes.extremes_server(crypto, None)
    summary, identity = await _pooled_summary(crypto, low, high)
    search = LambdaSearch(summary, grid=search_grid(options, len(low)))
    probed = ProbedMoments(pooled.noise_bound(crypto.ckks, len(rc.parties), options))
    while not search.finished:
        probe = search.probe()
        await rc.broadcast(probe)
        search.update(*await _pooled_moments(crypto, probe, low, high, summary.count,
                                             probed))
    unsure = probed.unsure(search, summary)
    if len(unsure):
        names = ", ".join(f"feature {j + 1}" for j in unsure)
        raise InputError(f"PPF Yeo-Johnson cannot vouch for the λ of {names}: the flooded "
                         f"sums' noise could move its log-likelihood by more than "
                         f"{LLF_TOLERANCE:g} of itself (the transformed values are too nearly "
                         "constant for the flooding's precision)")
    mean, var = probed.chosen(search, identity)
    await rc.broadcast(PpfYeoJohnsonResult(lambdas=search.lambdas, mean=mean, var=var))
    return YeoJohnsonNormalizer(search.lambdas, mean, var)


async def _pooled_summary(crypto: ServerCrypto, low: np.ndarray, high: np.ndarray
                          ) -> tuple[PooledSummary, tuple[np.ndarray, np.ndarray]]:
    """Step 2: n_g, #(x < 0), Σ sign(x)·log1p|x|, and the mean and variance of x / max|x|
    (scikit-learn's constant test is scale-free; 0 variance where min = max, exactly);
    and the mean and variance of x itself (NaN without values)."""
    width = len(low)
    sums = (await pooled.pooled_sum(crypto, 5 * width)).reshape(5, width)
    count, negatives = np.rint(sums[0]), np.rint(sums[1])
    mean, var, _ = pooled_moments(sums[3:], count, *midrange(low, high))
    present = count > 0
    mean = np.where(present, mean, np.nan)
    var = np.where(present, np.where(low == high, 0.0, var), np.nan)
    with np.errstate(invalid="ignore"):
        max_abs = np.nan_to_num(np.fmax(np.abs(low), np.abs(high)))
        scale = np.where(max_abs > 0, max_abs, 1.0)
        summary = PooledSummary(count, mean / scale, var / scale**2, max_abs, negatives,
                                sums[2])
    return summary, (mean, var)


async def _pooled_moments(crypto: ServerCrypto, probe: Candidates, low: np.ndarray,
                          high: np.ndarray, count: np.ndarray, probed: ProbedMoments
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Step 3, one round: the pooled mean and variance of yj(x, λ) per candidate."""
    lambdas = probe.lambdas
    center, half = midrange(*transform_bounds(low[probe.features], high[probe.features],
                                              lambdas))
    sums = (await pooled.pooled_sum(crypto, 2 * lambdas.size)).reshape(2, *lambdas.shape)
    mean, var, first = pooled_moments(sums, count[probe.features][:, None], center, half)
    probed.record(probe, count, mean, var, half, first)
    return mean, var


# -- party -------------------------------------------------------------------------------
def require_grid(lambdas: np.ndarray, round_number: int, grid: int) -> None:
    """ProtocolError unless a round probes at most the candidates per feature an honest
    search does (:data:`FIRST_GRID`, then ``grid``): each one is a pooled mean and
    variance the server learns."""
    allowed = FIRST_GRID if round_number == 1 else grid
    if lambdas.shape[1] > allowed:
        raise ProtocolError(f"Yeo-Johnson round {round_number} probes {lambdas.shape[1]} "
                            f"candidates per feature, more than the search's {allowed}")



async def party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> YeoJohnsonNormalizer:
    crypto = await setup_party(rc, options.preset, **setup_arguments(options),
                               **flooding_arguments(options))
    low, high = await extremes.extremes_party(crypto, X)
    columns = PartyColumns(X)
    count = feature_counts(X)
    await pooled.send_sum(crypto, _summary(X, count, low, high))
    rounds, grid = 0, search_grid(options, X.shape[1])
    while isinstance(msg := await serve_phase(crypto, (Candidates, PpfYeoJohnsonResult),
                                              pooled.POOLED_SUM), Candidates):
        rounds += 1
        if rounds > search_round_limit(grid):
            raise ProtocolError(f"the server's λ search exceeds {search_round_limit(grid)} "
                                "rounds")
        features, lambdas = columns.check(msg)
        require_grid(lambdas, rounds, grid)
        mean, m2 = moments_from_logs(columns.logs.select(features), lambdas)
        center, half = midrange(*transform_bounds(low[features], high[features], lambdas))
        await pooled.send_sum(crypto, party_moments(count[features][:, None], mean, m2,
                                                    center, half).ravel())
    width = X.shape[1]
    lambdas = as_float_vector(msg.lambdas, width, "Yeo-Johnson lambdas from the server")
    if not np.isfinite(lambdas).all():
        raise ProtocolError("Yeo-Johnson lambdas from the server are not all finite")
    return YeoJohnsonNormalizer(lambdas, as_float_vector(msg.mean, width, "mean"),
                                as_float_vector(msg.var, width, "variance"))


def _summary(X: np.ndarray, count: np.ndarray, low: np.ndarray, high: np.ndarray
             ) -> np.ndarray:
    """Party side of step 2: count, #(x < 0), Σ sign(x)·log1p|x|, and the two moments."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, np.nansum(X, axis=0) / np.maximum(count, 1), 0.0)
        m2 = np.nansum((X - mean) ** 2, axis=0)
    return np.concatenate([
        count, np.sum(X < 0, axis=0).astype(np.float64),
        np.nansum(np.sign(X) * np.log1p(np.abs(X)), axis=0),
        party_moments(count, mean, m2, *midrange(low, high)).ravel()])
