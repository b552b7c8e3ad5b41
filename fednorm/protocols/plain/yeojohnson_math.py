"""The statistics of the plain Yeo-Johnson search: the profile log-likelihood, SciPy's
λ bounds, and the parties' pooled moments of the transformed data.

Pure float64 functions on pooled (or one party's) statistics; the protocol and its
search are :mod:`fednorm.protocols.plain.yeojohnson`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FIRST_GRID = 16  # candidates per feature in the first round, across SciPy's bounds
GRID = 6  # candidates per feature in every later round, inside the bracket
TOLERANCE = 1e-8  # final grid spacing, in asinh(λ) units (SciPy's fminbound: xtol 1.48e-8)
LAMBDA_CAP = 1e12  # brackets are clipped to |λ| ≤ this, which bounds the rounds
LLF_NOISE = 1e-3  # candidates whose llf rounding noise exceeds this are rejected
NOISE_PENALTY = 10.0  # the search maximizes llf − NOISE_PENALTY · its rounding noise
BLOCK_VALUES = 2**16  # (value, λ) pairs a party transforms at once

_EPS = np.finfo(np.float64).eps
_TINY = np.finfo(np.float64).tiny


def search_rounds(width: float, grid: int = GRID, tolerance: float = TOLERANCE,
                  first_grid: int = FIRST_GRID) -> int:
    """Rounds the grid search needs for a bracket ``width`` wide (in asinh(λ) units).

    Round 1 probes ``first_grid`` points across the bracket, ends included (spacing
    width/(first_grid−1)); it keeps at most two of its cells.  Every later round
    probes ``grid`` points inside the bracket kept, which shrinks it by (grid+1)/2.
    The search stops once the spacing is ≤ tolerance.
    """
    spacing = width / (first_grid - 1)
    if spacing <= tolerance:
        return 1
    inside = 2 * spacing / (grid + 1)  # round 2's spacing, at most
    if inside <= tolerance:
        return 2
    return 2 + math.ceil(math.log(inside / tolerance) / math.log((grid + 1) / 2))


MAX_SEARCH_ROUNDS = search_rounds(2 * math.asinh(LAMBDA_CAP))


def merge_moments(
    count: np.ndarray, mean: np.ndarray, m2: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chan et al.'s parallel merge of per-party (count, mean, M2) along axis 0.

    M2 = Σ M2_p + Σ n_p (mean_p − mean)², all terms non-negative, so nothing cancels.
    A party with no values (n_p = 0) must send mean 0 and M2 0.
    """
    total = count.sum(axis=0)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        pooled = (count * mean).sum(axis=0) / np.maximum(total, 1)
        spread = np.where(count > 0, count * (mean - pooled) ** 2, 0.0)
        return total, pooled, m2.sum(axis=0) + spread.sum(axis=0)


def is_constant(count: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """scikit-learn's ``_is_constant_feature``: var within the two-pass error bound.

    The bound (Chan, Golub & LeVeque) is n·eps·var + (n·mean·eps)²; features without
    values count as constant too (λ = 1 for them as well).
    """
    with np.errstate(invalid="ignore", over="ignore"):
        bound = count * _EPS * var + (count * mean * _EPS) ** 2
        return (count == 0) | ~(var > bound)


def lambda_bounds(max_abs: np.ndarray, negatives: np.ndarray, count: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """SciPy's ``yeojohnson_normmax`` bounds, clipped to ±:data:`LAMBDA_CAP`.

    They keep yj(x, λ) for |x| ≤ 20·max|x| within half the float64 exponent range,
    so the variance of the transformed data neither overflows nor underflows.  When
    they cross (values of both signs beyond ~1e146; SciPy then raises), λ is fixed to 1.
    """
    log_tiny = (math.log(_TINY) - math.log(_EPS)) / 2
    log_max = (math.log(np.finfo(np.float64).max) + math.log(_EPS)) / 2
    with np.errstate(divide="ignore", over="ignore"):
        log1p_max = np.log1p(20 * max_abs)
        lower, upper = log_tiny / log1p_max, log_max / log1p_max
    all_negative, some_negative = negatives >= count, negatives > 0
    lower, upper = (
        np.where(all_negative, 2 - upper,
                 np.where(some_negative, np.maximum(2 - upper, lower), lower)),
        np.where(all_negative, 2 - lower,
                 np.where(some_negative, np.minimum(2 - lower, upper), upper)),
    )
    lower = np.nan_to_num(np.clip(lower, -LAMBDA_CAP, LAMBDA_CAP), nan=-LAMBDA_CAP)
    upper = np.nan_to_num(np.clip(upper, -LAMBDA_CAP, LAMBDA_CAP), nan=LAMBDA_CAP)
    # Both signs beyond about ±1e146: no λ is safe for both tails (SciPy raises).
    crossed = lower > upper
    return np.where(crossed, 1.0, lower), np.where(crossed, 1.0, upper)


def log_likelihood(lambdas: np.ndarray, count: np.ndarray, var: np.ndarray,
                   log_sum: np.ndarray) -> np.ndarray:
    """llf(λ) from the pooled variance of yj(x, λ); −inf where it is not finite or
    the variance is below tiny (where SciPy's llf is +inf, which it rejects as −inf)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        llf = -count / 2 * np.log(var) + (lambdas - 1) * log_sum
    return np.where((var >= _TINY) & np.isfinite(llf), llf, -np.inf)


def rounding_noise(count: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """How far rounding alone moves the computed llf: about eps·sqrt(n·(1 + mean²/var)).

    Each yj(x, λ) carries a relative error of about eps, so Σ(y − ȳ)² is off by a
    relative 2·eps·sqrt(ȳ² + var)/(sqrt(n)·sd), and n/2·log(var) by n/2 times that.
    It is ~1e-14 for ordinary data, and explodes where yj(x, λ) ≈ 1/|λ| for every x
    (λ far out, data of one sign) and the variance lives in the last bits.
    """
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        noise = _EPS * np.sqrt(count * (1 + mean**2 / var))
    return np.where(np.isnan(noise), np.inf, noise)


def candidate_scores(lambdas: np.ndarray, count: np.ndarray, mean: np.ndarray,
                     var: np.ndarray, log_sum: np.ndarray) -> np.ndarray:
    """What the search maximizes: llf − NOISE_PENALTY·(rounding noise of llf).

    On a flat llf a candidate deep in the noisy region could otherwise win on a
    rounding error (two values near −980: llf(2) − llf(5.5) is 5e-5, the noise at
    5.5 is 7e-4); the penalty is ~1e-13 where llf is sound, so it does not move λ
    there.  Candidates whose noise exceeds :data:`LLF_NOISE` are rejected (−inf).
    """
    noise = rounding_noise(count, mean, var)
    score = log_likelihood(lambdas, count, var, log_sum) - NOISE_PENALTY * noise
    return np.where(noise <= LLF_NOISE, score, -np.inf)


# -- the server's search (sans-IO) -----------------------------------------------------------
@dataclass(frozen=True)
class PooledSummary:
    """The pooled round-1 statistics the search is planned from.

    ``mean`` and ``var`` are those of x / max|x| (pooled max): the constant-feature
    test is scale-invariant, and scaled values cannot overflow.
    """

    count: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    max_abs: np.ndarray
    negatives: np.ndarray
    log_sum: np.ndarray

    @classmethod
    def merge(cls, count: np.ndarray, max_abs: np.ndarray, scaled_mean: np.ndarray,
              scaled_m2: np.ndarray, negatives: np.ndarray, log_sum: np.ndarray
              ) -> PooledSummary:
        """Pool (parties, features) arrays of the parties' summaries."""
        pooled_max = max_abs.max(axis=0)
        with np.errstate(invalid="ignore", divide="ignore", under="ignore"):
            ratio = np.where(pooled_max > 0, max_abs / np.where(pooled_max > 0, pooled_max, 1),
                             0.0)
            total, mean, m2 = merge_moments(count, scaled_mean * ratio, scaled_m2 * ratio**2)
            var = np.where(total > 0, m2 / np.maximum(total, 1), np.nan)
        return cls(total, np.where(total > 0, mean, np.nan), var, pooled_max,
                   negatives.sum(axis=0), log_sum.sum(axis=0))


def transformed_moments(column: np.ndarray, lambdas: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Mean and M2 of yj(column, λ) for each λ (see :func:`moments_from_logs`)."""
    mean, m2 = moments_from_logs(SignLogs.of(column[:, None]), lambdas[None, :])
    return mean[0], m2[0]


@dataclass(frozen=True)
class Segments:
    """Values grouped by feature: feature j's are ``values[start_j : start_j + counts[j]]``."""

    values: np.ndarray
    counts: np.ndarray  # int64, one per feature

    @classmethod
    def log1p_of(cls, columns: list[np.ndarray]) -> Segments:
        values = np.concatenate(columns) if columns else np.zeros(0)
        return cls(np.log1p(values), np.array([len(c) for c in columns], dtype=np.int64))

    def select(self, features: np.ndarray) -> Segments:
        """The segments of ``features``, in that order."""
        if np.array_equal(features, np.arange(len(self.counts))):
            return self
        ends = np.cumsum(self.counts)[features]
        pieces = [self.values[end - n:end]
                  for end, n in zip(ends, self.counts[features], strict=True)]
        return Segments(np.concatenate(pieces) if pieces else self.values[:0],
                        self.counts[features])


@dataclass(frozen=True)
class SignLogs:
    """log1p|x| of a party's present values, by sign and feature: all yj(x, λ) needs.

    A party computes them once, not once per λ search round.
    """

    positive: Segments  # log1p(x) for x ≥ 0
    negative: Segments  # log1p(−x) for x < 0

    @classmethod
    def of(cls, X: np.ndarray) -> SignLogs:
        columns = [col[~np.isnan(col)] for col in X.T]
        return cls(Segments.log1p_of([col[col >= 0] for col in columns]),
                   Segments.log1p_of([-col[col < 0] for col in columns]))

    def select(self, features: np.ndarray) -> SignLogs:
        return SignLogs(self.positive.select(features), self.negative.select(features))


def moments_from_logs(logs: SignLogs, lambdas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and M2 of yj(x, λ) per (feature, λ): row j of ``lambdas`` for feature j.

    yj(x, λ) = sign(x)·expm1(a·log1p|x|)/a, with a = λ for x ≥ 0 and 2 − λ below.
    The values of each sign are one part, in which a is the same for every row: the
    part's moments are those of E = expm1(a·log1p|x|), scaled by 1/a (mean) and 1/a²
    (M2), so each (value, λ) costs a multiply and an expm1, and no row-by-row sign or
    division.  Every feature is transformed in the same array operations (a call per
    feature and sign cost a third of the time at 1,000 rows per party, measured in
    ``bench/runs/2026-11-27-plain-yeojohnson-search.md``); the parts are
    merged by Chan's formula; where a is 0 the part is log1p|x|.  A feature without
    values gets mean 0 and M2 0.
    """
    parts = [_part_moments(logs.positive, lambdas, 1.0),
             _part_moments(logs.negative, 2.0 - lambdas, -1.0)]
    count, mean, m2 = (np.stack(arrays) for arrays in zip(*parts, strict=True))
    _, mean, m2 = merge_moments(count[:, :, None], mean, m2)
    return mean, m2


def _part_moments(logs: Segments, exponents: np.ndarray, sign: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, mean, M2) of sign·expm1(a·log)/a per feature and exponent a (0 if empty)."""
    count, mean, m2 = segment_moments(logs, exponents)
    at_zero = np.abs(exponents) < np.spacing(1.0)
    if at_zero.any():
        _, log_mean, log_m2 = segment_moments(logs, None)
        mean = np.where(at_zero, log_mean, mean)
        m2 = np.where(at_zero, log_m2, m2)
    scale = np.where(at_zero, 1.0, exponents)
    with np.errstate(invalid="ignore", over="ignore"):
        return count, sign * mean / scale, m2 / scale**2


def segment_moments(logs: Segments, exponents: np.ndarray | None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count, mean and M2 of expm1(a·v) per feature and exponent a (a row of
    ``exponents`` per feature), or of v itself when ``exponents`` is None (one column).

    The values go in blocks of about :data:`BLOCK_VALUES` / (exponents per feature),
    which keeps the temporaries small; a block holds pieces of features, one exponent
    per row, so every reduction is contiguous; a feature's pieces are merged by Chan's
    formula.
    """
    values, counts = logs.values, logs.counts
    width = 1 if exponents is None else exponents.shape[1]
    mean = np.zeros((len(counts), width))
    m2 = np.zeros((len(counts), width))
    if not len(values):
        return counts, mean, m2
    ends = np.cumsum(counts)
    block = max(1, BLOCK_VALUES // width)
    cuts = np.union1d((ends - counts)[counts > 0], np.arange(0, len(values), block))
    piece_n = np.diff(np.append(cuts, len(values)))
    piece_feature = np.searchsorted(ends, cuts, side="right")
    piece_mean = np.empty((width, len(cuts)))
    piece_m2 = np.empty((width, len(cuts)))
    with np.errstate(invalid="ignore", over="ignore"):
        for first in range(0, len(values), block):
            inside = slice(*np.searchsorted(cuts, [first, first + block]))
            n, block_values = piece_n[inside], values[first:first + block]
            if exponents is None:
                E = block_values[None, :].copy()
            else:
                E = np.repeat(exponents[piece_feature[inside]].T, n, axis=1)
                E *= block_values
                np.expm1(E, out=E)
            starts = cuts[inside] - first
            piece_mean[:, inside] = np.add.reduceat(E, starts, axis=1) / n
            E -= np.repeat(piece_mean[:, inside], n, axis=1)
            np.square(E, out=E)
            piece_m2[:, inside] = np.add.reduceat(E, starts, axis=1)
        group = np.flatnonzero(np.diff(piece_feature, prepend=-1))
        features = piece_feature[group]
        merged = np.add.reduceat(piece_mean * piece_n, group, axis=1) / counts[features]
        around = np.repeat(merged, np.diff(np.append(group, len(cuts))), axis=1)
        spread = np.where(piece_mean == around, 0.0, piece_n * (piece_mean - around) ** 2)
        mean[features] = merged.T
        m2[features] = np.add.reduceat(piece_m2 + spread, group, axis=1).T
    return counts, mean, m2
