"""Federated Yeo-Johnson: the pooled maximum-likelihood λ, then a pooled z-score.

scikit-learn's ``PowerTransformer(method="yeo-johnson")`` picks, per feature, the λ
that maximizes the profile log-likelihood over the non-NaN values

    llf(λ) = −n/2 · log var(yj(x, λ)) + (λ − 1) · Σ sign(x)·log1p(|x|)

(with SciPy ≥ 1.9 it calls ``scipy.stats.yeojohnson``, i.e. ``fminbound`` on bounds
that keep yj(x, λ) and its variance inside the float64 range for |x| up to 20·max|x|),
then standardizes the transformed data.  Here:

1. Each party sends per feature its count, max |x| and number of negative values
   (for SciPy's bounds), mean and M2 of x / max|x| (for the constant-feature test;
   scaled so that |x| near 1e300 does not overflow M2), and Σ sign(x)·log1p(|x|)
   (the λ-linear term of llf).
2. The server searches λ on a grid, all features in parallel: each round it sends
   candidates per open feature spread evenly in asinh(λ): :data:`FIRST_GRID` across
   SciPy's bounds (ends included), then :data:`GRID` inside the bracket kept (whose
   ends were probed before); every party answers the mean and M2 of
   yj(x, λ) for each (feature, candidate); the server merges them with Chan et al.'s
   parallel formula (no Σy² − n·ȳ² cancellation), evaluates llf, and keeps the two grid
   cells around the best candidate (a bracket end counts as a grid point).  A
   log-likelihood that is not finite (overflow, or a variance below the smallest normal
   float, as SciPy rejects it) counts as −inf, and so does one that is mostly rounding
   noise (see :func:`candidate_scores`).
3. The server broadcasts the λ's; both sides run :mod:`zscore` as a sub-protocol on
   the transformed data.

Searching in asinh(λ) makes the final grid spacing :data:`TOLERANCE` mean an error of
about TOLERANCE·max(1, |λ|), and lets one grid span SciPy's bounds, which reach
|λ| ~ 1e4 for data near 1e-3.  A unimodal llf keeps its maximizer inside the kept
bracket, and the bracket shrinks by (FIRST_GRID − 1)/2, then (GRID + 1)/2 per round,
so the search takes at most :data:`MAX_SEARCH_ROUNDS` rounds whatever the data
(brackets are clipped to |λ| ≤ :data:`LAMBDA_CAP`); the whole protocol at most
:data:`MAX_ROUNDS` gather rounds.

Conventions: a feature whose pooled non-NaN values are constant (scikit-learn's
``_is_constant_feature`` test on the pooled mean and variance) gets λ = 1, the
identity, and variance 0, so the normalizer maps it to 0; a feature with no values
gets λ = 1 and NaN mean and variance, as in :mod:`zscore`.  scikit-learn makes the
same choices, except that its constant test sees NaN (and so never fires) on a
column holding NaNs; it then optimizes λ on constant data, which has no maximizer.
λ is not chosen where llf is mostly rounding noise (few values of one sign far
from 0, λ far out: yj(x, λ) ≈ 1/|λ| for all x and the spread lives in the last
bits) as long as one first-round candidate is sound; scikit-learn can land there, and
its λ is then noise too.  When none is (nearly constant data whose sound window, if
any, falls between the first round's candidates), λ is the candidate nearest 1, and
its llf may be noise.

:class:`LambdaSearch` is sans-IO: it only turns pooled variances into the next
candidates, so an encrypted variant can reuse it with its own aggregation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message, as_float_vector, message
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
from fednorm.protocols.normalizers import YeoJohnsonNormalizer, yeo_johnson
from fednorm.protocols.plain import zscore
from fednorm.protocols.plain.yeojohnson_math import (
    FIRST_GRID,
    GRID,
    LAMBDA_CAP,
    MAX_SEARCH_ROUNDS,
    TOLERANCE,
    PooledSummary,
    SignLogs,
    candidate_scores,
    is_constant,
    lambda_bounds,
    merge_moments,
    moments_from_logs,
    search_rounds,
)

LEDGER = declare("yeojohnson", "plain", {
    "yeojohnson.local_summary": ("count", "max_abs", "scaled_mean", "scaled_m2",
                                 "negatives", "log_sum"),
    "yeojohnson.candidates": ("features", "lambdas"),
    "yeojohnson.moments": ("mean", "m2"),
    "yeojohnson.lambdas": ("lambdas",),
    **zscore.LEDGER.plaintext,
})

MAX_GRID = 4096  # a party refuses bigger candidate grids (a cheap denial-of-service guard)
MAX_ROUNDS = 1 + MAX_SEARCH_ROUNDS + 2  # summary, λ search, z-score's two rounds


# -- messages ---------------------------------------------------------------------------
@message("yeojohnson.local_summary")
class LocalSummary(Message):
    """Per feature: count, max |x|, mean and M2 of x / max |x|, #(x < 0), Σ sign(x)·log1p|x|."""

    count: np.ndarray
    max_abs: np.ndarray
    scaled_mean: np.ndarray
    scaled_m2: np.ndarray
    negatives: np.ndarray
    log_sum: np.ndarray


@message("yeojohnson.candidates")
class Candidates(Message):
    """Row i of ``lambdas`` holds the candidate λ's for feature ``features[i]``."""

    features: np.ndarray
    lambdas: np.ndarray


@message("yeojohnson.moments")
class Moments(Message):
    """A party's mean and M2 of yj(x, λ) per (feature, candidate), row-major."""

    mean: np.ndarray
    m2: np.ndarray


@message("yeojohnson.lambdas")
class Lambdas(Message):
    """The search is over: the chosen λ per feature."""

    lambdas: np.ndarray



class LambdaSearch:
    """Server-side state of the λ grid search, for all features at once.

    ``probe()`` gives the candidates of the open features; ``update(mean, var)``
    takes the pooled mean and population variance of yj(x, λ) for each of them,
    shape (open features, grid), however they were aggregated.  Features that are
    constant or empty are never searched and keep λ = 1.
    """

    def __init__(self, summary: PooledSummary, grid: int = GRID,
                 tolerance: float = TOLERANCE, first_grid: int = FIRST_GRID) -> None:
        if grid < 2 or first_grid < 3:
            raise ValueError(f"the λ grid needs at least 3 points in the first round and 2 "
                             f"in later ones, got {first_grid} and {grid}")
        self.grid = grid
        self.first_grid = first_grid
        self.tolerance = tolerance
        self.lambdas = np.ones(len(summary.count))
        searched = ~is_constant(summary.count, summary.mean, summary.var)
        self.features = np.flatnonzero(searched)
        lower, upper = lambda_bounds(summary.max_abs, summary.negatives, summary.count)
        self.lo = np.arcsinh(lower[searched])
        self.hi = np.arcsinh(upper[searched])
        self.count = summary.count[searched]
        self.log_sum = summary.log_sum[searched]
        self.open = np.ones(len(self.features), dtype=bool)
        self.rounds = 0
        self.max_rounds = search_rounds(2 * math.asinh(LAMBDA_CAP), grid, tolerance,
                                        first_grid)
        self._grid: np.ndarray | None = None

    @property
    def finished(self) -> bool:
        return not self.open.any() or self.rounds >= self.max_rounds

    def probe(self) -> Candidates:
        """Candidates for every open feature, evenly spaced in asinh(λ).

        The first round spreads :data:`FIRST_GRID` across SciPy's bounds, ends included:
        where llf is sound only in a narrow window (nearly constant data), fewer first
        candidates can all land in its rounding noise.  Later rounds leave the bracket's
        ends out: they were probed before.
        """
        if self.rounds == 0:
            steps = np.linspace(0.0, 1.0, self.first_grid)
        else:
            steps = np.arange(1, self.grid + 1) / (self.grid + 1)
        lo, hi = self.lo[self.open], self.hi[self.open]
        self._grid = lo[:, None] + (hi - lo)[:, None] * steps
        return Candidates(features=self.features[self.open], lambdas=np.sinh(self._grid))

    def update(self, mean: np.ndarray, var: np.ndarray) -> None:
        """Keep the two grid cells around each open feature's best candidate.

        A unimodal llf has its maximizer between the best candidate's neighbours; the
        first and last candidates' outer neighbours are the bracket's ends.
        """
        if self._grid is None:
            raise RuntimeError("update() before probe()")
        grid, self._grid = self._grid, None
        mean, var = np.asarray(mean, dtype=np.float64), np.asarray(var, dtype=np.float64)
        if mean.shape != grid.shape or var.shape != grid.shape:
            raise ProtocolError(f"expected pooled means and variances of shape {grid.shape}, "
                                f"got {mean.shape} and {var.shape}")
        self.rounds += 1
        open_ = np.flatnonzero(self.open)
        lambdas = np.sinh(grid)
        llf = candidate_scores(lambdas, self.count[open_, None], mean, var,
                               self.log_sum[open_, None])
        rows = np.arange(len(open_))
        best = np.argmax(llf, axis=1)
        # No finite llf at all: nothing to climb.  In the first round take the candidate
        # nearest the identity; later, keep the previous round's (sound) best.
        hopeless = np.isneginf(llf[rows, best])
        best[hopeless] = np.argmin(np.abs(grid - math.asinh(1.0)), axis=1)[hopeless]
        chosen = self.features[open_]
        self.lambdas[chosen] = np.where(hopeless & (self.rounds > 1), self.lambdas[chosen],
                                        lambdas[rows, best])
        spacing, last = grid[:, 1] - grid[:, 0], grid.shape[1] - 1
        lo, hi = self.lo[open_], self.hi[open_]
        self.lo[open_] = np.where(best > 0, grid[rows, np.maximum(best - 1, 0)], lo)
        self.hi[open_] = np.where(best < last, grid[rows, np.minimum(best + 1, last)], hi)
        self.open[open_[(spacing <= self.tolerance) | hopeless]] = False


# -- the party's side ------------------------------------------------------------------------
class PartyColumns:
    """One party's present values per feature, and the answers computed from them."""

    def __init__(self, X: np.ndarray) -> None:
        self.n_features = X.shape[1]
        self.logs = SignLogs.of(X)
        self._X = X

    def summary(self) -> LocalSummary:
        X = self._X
        count = feature_counts(X)
        max_abs = np.where(np.isnan(X), 0.0, np.abs(X)).max(axis=0, initial=0.0)
        scaled = X / np.where(max_abs > 0, max_abs, 1.0)
        mean = np.where(count > 0, np.nansum(scaled, axis=0) / np.maximum(count, 1), 0.0)
        return LocalSummary(
            count=count,
            max_abs=max_abs,
            scaled_mean=mean,
            scaled_m2=np.nansum((scaled - mean) ** 2, axis=0),
            negatives=np.sum(X < 0, axis=0).astype(np.float64),
            log_sum=np.nansum(np.sign(X) * np.log1p(np.abs(X)), axis=0),
        )

    def check(self, probe: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """The probe's features and candidates, or a ProtocolError if malformed."""
        features, lambdas = probe.features, probe.lambdas
        if not (isinstance(features, np.ndarray) and features.ndim == 1
                and features.dtype.kind in "iu"):
            raise ProtocolError("Yeo-Johnson candidates: features must be an integer vector")
        if len(features) and (features.min() < 0 or features.max() >= self.n_features
                              or len(np.unique(features)) != len(features)):
            raise ProtocolError("Yeo-Johnson candidates name features this party does not have")
        if not (isinstance(lambdas, np.ndarray) and lambdas.ndim == 2
                and lambdas.shape[0] == len(features) and 1 <= lambdas.shape[1] <= MAX_GRID
                and lambdas.dtype.kind in "iuf"):
            shape = getattr(lambdas, "shape", type(lambdas).__name__)
            raise ProtocolError(f"Yeo-Johnson candidates: expected a ({len(features)}, grid) "
                                f"array with 1 ≤ grid ≤ {MAX_GRID}, got {shape}")
        lambdas = lambdas.astype(np.float64, copy=False)
        if not np.isfinite(lambdas).all():
            raise ProtocolError("Yeo-Johnson candidates are not all finite")
        return features.astype(np.int64), lambdas

    def moments(self, probe: Candidates) -> Moments:
        """Mean and M2 of yj(x, λ) per (feature, candidate); 0 and 0 without values."""
        features, lambdas = self.check(probe)
        mean, m2 = moments_from_logs(self.logs.select(features), lambdas)
        return Moments(mean=mean.ravel(), m2=m2.ravel())


# -- wiring ------------------------------------------------------------------------------
def _pooled_moments(count: np.ndarray, probe: Candidates,
                    replies: Mapping[int, Moments] | list[Moments]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Pooled mean and population variance per (feature, candidate) from the parties'.

    ``count`` is (parties, features), rows in the order of ``replies``.
    """
    shape = probe.lambdas.shape
    named = replies if isinstance(replies, Mapping) else dict(enumerate(replies, 1))
    mean = gathered_vectors(named, "mean", math.prod(shape)).reshape(-1, *shape)
    m2 = gathered_vectors(named, "m2", math.prod(shape)).reshape(-1, *shape)
    n = count[:, probe.features, None]
    total, pooled_mean, pooled_m2 = merge_moments(n, mean, m2)
    return pooled_mean, pooled_m2 / np.maximum(total, 1)


def _summary_arrays(replies: Mapping[int, LocalSummary]) -> dict[str, np.ndarray]:
    """The parties' summaries as (parties, features) arrays, sanity-checked."""
    count = gathered_vectors(replies, "count")
    arrays = {"count": count}
    for name in ("max_abs", "scaled_mean", "scaled_m2", "negatives", "log_sum"):
        arrays[name] = gathered_vectors(replies, name, count.shape[1])
    valid = (
        np.all(count >= 0) and np.all(count == np.round(count))
        and np.all((arrays["negatives"] >= 0) & (arrays["negatives"] <= count))
        and np.all(arrays["max_abs"] >= 0) and np.all(arrays["scaled_m2"] >= 0)
        and all(np.isfinite(a).all() for a in arrays.values())
    )
    if not valid:
        raise ProtocolError("a party's Yeo-Johnson summary is inconsistent "
                            "(negative or fractional counts, or non-finite statistics)")
    return arrays


def _search_locally(columns: PartyColumns) -> np.ndarray:
    """The whole λ search over one party's data, with no communication."""
    summary = _summary_arrays({1: columns.summary()})
    search = LambdaSearch(PooledSummary.merge(**summary))
    while not search.finished:
        probe = search.probe()
        search.update(*_pooled_moments(summary["count"], probe, [columns.moments(probe)]))
    return search.lambdas


async def server(ctx: RoleContext, options: FitOptions) -> YeoJohnsonNormalizer:
    summary = _summary_arrays(await ctx.gather(LocalSummary))
    search = LambdaSearch(PooledSummary.merge(**summary))
    while not search.finished:
        probe = search.probe()
        await ctx.broadcast(probe)
        replies = await ctx.gather(Moments)
        search.update(*_pooled_moments(summary["count"], probe, replies))
    await ctx.broadcast(Lambdas(lambdas=search.lambdas))
    with ctx.subprotocol("zscore"):
        scaled = await zscore.server(ctx, options)
    return YeoJohnsonNormalizer(search.lambdas, scaled.mean, scaled.var)


async def party(ctx: RoleContext, X: np.ndarray, options: FitOptions) -> YeoJohnsonNormalizer:
    columns = PartyColumns(X)
    await ctx.send(SERVER, columns.summary())
    rounds = 0
    while isinstance(msg := await ctx.receive(SERVER, (Candidates, Lambdas)), Candidates):
        rounds += 1
        if rounds > MAX_SEARCH_ROUNDS:
            raise ProtocolError(f"the server's λ search exceeds {MAX_SEARCH_ROUNDS} rounds")
        await ctx.send(SERVER, columns.moments(msg))
    lambdas = as_float_vector(msg.lambdas, X.shape[1], "Yeo-Johnson lambdas from the server")
    if not np.isfinite(lambdas).all():
        raise ProtocolError("Yeo-Johnson lambdas from the server are not all finite")
    with ctx.subprotocol("zscore"):
        scaled = await zscore.party(ctx, yeo_johnson(X, lambdas), options)
    return YeoJohnsonNormalizer(lambdas, scaled.mean, scaled.var)


def fit_local(X: np.ndarray, options: FitOptions) -> YeoJohnsonNormalizer:
    lambdas = _search_locally(PartyColumns(X))
    scaled = zscore.fit_local(yeo_johnson(X, lambdas), options)
    return YeoJohnsonNormalizer(lambdas, scaled.mean, scaled.var)


register("yeojohnson", "plain", Kind(server, party))
register_local("yeojohnson", fit_local)
