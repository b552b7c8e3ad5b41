"""The k-th ranked element by binary search on aggregated counts (paper Algorithm 4).

The server keeps, for every target (a feature and a 1-based rank k), a bracket
[lo, hi] that holds the k-th smallest value x_(k).  Each round it sends the
midpoints; every party answers how many of its values are ≤ each midpoint; the
sums decide which half holds x_(k).  All features and all ranks are searched in
the same rounds, and a target stops once its bracket is narrower than its ε, so
the answer is within ε/2 of x_(k) after at most ⌈log2(range/ε)⌉ rounds.

Multi-probe search (``FitOptions.rank_probes`` = K > 1): each round probes K points
evenly inside each bracket instead of its midpoint, and the bracket shrinks to the cell
where the count crosses k, K + 1 times narrower; ⌈log_{K+1}(range/ε)⌉ rounds, at the
price of K revealed counts per target and round.  K = 1 is the paper's bisection.
Targets of one feature whose brackets coincide (a feature's quartiles before the first
rounds tell them apart) share their points, as distinct ones: a round never probes a
feature at more than K points per open target, and a shared bracket shrinks faster.

:class:`RankSearch` is the sans-IO state machine and :func:`search_server` /
:func:`search_party` its message loop; the plaintext (:mod:`fednorm.protocols.plain.kth`)
and encrypted (:mod:`fednorm.protocols.ppf.kth`) protocols only differ in how the
per-round counts get summed (their :class:`CountAggregator`).

Quantiles follow numpy's / scikit-learn's linear interpolation between the two
order statistics around position q·(n−1).  The paper's rule — accept any
midpoint in the gap between those two order statistics — is kept as
``quantile_rule="gap"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fednorm.engine.errors import ProtocolError
from fednorm.engine.messages import Message, message
from fednorm.engine.runtime import RoleContext
from fednorm.protocols import float_order
from fednorm.protocols.base import MAX_RANK_PROBES, FitOptions
from fednorm.protocols.quantiles import QuantilePlan
from fednorm.protocols.rank_rounds import (
    feature_epsilon,
    options_probes,
    planned_rounds,
)


@message("rank.probe")
class RankProbe(Message):
    """Midpoints to count at: ``points[i]`` applies to feature ``features[i]``."""

    features: np.ndarray
    points: np.ndarray


SEARCH_PLAINTEXT = {"rank.probe": ("features", "points")}
"""The search's probes, in the clear in both kinds (the ledger's entry for them)."""


@message("rank.done")
class RankDone(Message):
    """Every target is found: the search is over."""


def search_probes(options: FitOptions, targets: int, max_points: int | None = None,
                  default: int = 1) -> int:
    """Points probed per target and round: ``rank_probes`` (``default`` if None), capped
    so that a round's points fit ``max_points`` (one ciphertext's slots, under
    encryption).  Server and parties compute it alike from public numbers."""
    probes = options_probes(options, default)
    if max_points is not None and targets:
        probes = max(1, min(probes, max_points // targets))
    return probes


def start_search(
    plan: QuantilePlan, counts: np.ndarray, low: np.ndarray, high: np.ndarray,
    options: FitOptions, max_points: int | None = None,
) -> RankSearch:
    """The search for ``plan`` inside the known extremes [low, high], with the options' ε
    and probes per target."""
    probes = search_probes(options, len(plan.features), max_points)
    return RankSearch(plan, counts, low, high, feature_epsilon(low, high, options), probes)


def start_unbounded_search(plan: QuantilePlan, counts: np.ndarray, options: FitOptions,
                           probes: int) -> RankSearch:
    """The search for ``plan`` when no extremes are known: every bracket starts as the
    whole float order, and the search is exact unless an absolute ε is given (a range to
    take ``relative_epsilon`` of is not known)."""
    width = len(counts)
    return RankSearch(plan, counts, np.full(width, -np.inf), np.full(width, np.inf),
                      np.full(width, options.epsilon or 0.0), probes, extremes_known=False)


def opening_probe(width: int, room: int, quantiles: Sequence[float], options: FitOptions
                  ) -> RankProbe:
    """The unbounded search's first round, known before n_g is (every role computes it
    alone): per feature, points evenly spaced in the whole float order, as many as
    ``room`` slots hold were every feature to have the most targets (two per quantile),
    so never more per feature than a party allows whatever n_g's plan (:func:`probe_limit`;
    at most :data:`~fednorm.protocols.base.MAX_RANK_PROBES`, or K if larger)."""
    most = probe_limit(1, quantiles)
    chosen = options_probes(options, MAX_RANK_PROBES)
    per_target = min(chosen, room // (most * width)) if width else 0
    count = min(most * per_target, max(chosen, MAX_RANK_PROBES))
    whole = float_order.keys(np.array([-np.inf, np.inf]))
    cuts = float_order.thresholds(np.full(width, whole[0] - 1), np.full(width, whole[1]),
                                  count) if count else np.zeros((width, 0), dtype=np.int64)
    return RankProbe(features=np.repeat(np.arange(width), count),
                     points=float_order.values(cuts).ravel())


class RankSearch:
    """Server-side state of Algorithm 4 for many (feature, rank) targets at once.

    A target's bracket is kept as float64 order keys (:mod:`.float_order`): x_(k) lies in
    (lo, hi], so at most k − 1 values lie at or below ``lo`` and at least k at or below
    ``hi``.  With a precision ε > 0, probes are evenly spaced in value (what narrows a
    bracket to ε fastest) while that still splits it; at the float spacing, or with
    ε = 0 (exact), they are evenly spaced in the float order, so every round cuts the
    floats in the bracket by K + 1 whatever their magnitudes (subnormals and signed zeros
    included), and a target ends on one float at the latest.
    """

    def __init__(
        self,
        plan: QuantilePlan,
        counts: np.ndarray,
        low: np.ndarray,
        high: np.ndarray,
        epsilon: np.ndarray,
        probes: int = 1,
        extremes_known: bool = True,
    ) -> None:
        if probes < 1:
            raise ValueError(f"probes must be at least 1, got {probes}")
        f = plan.features
        self.probes = probes
        self.features = f
        self.ranks = plan.ranks
        self.gap = plan.gap
        self.n = counts[f]
        self.lo = float_order.keys(low[f]) - 1  # exclusive: below every value
        self.hi = float_order.keys(high[f])
        self.epsilon = epsilon[f]
        self.value = np.full(len(f), np.nan)
        self.done = np.zeros(len(f), dtype=bool)
        self.rounds = 0
        if extremes_known:  # the smallest and largest ranks are the bounds themselves
            self._finish(~self.gap & (self.ranks <= 1), low[f].astype(np.float64))
            self._finish(~self.gap & (self.ranks >= self.n), high[f].astype(np.float64))
        self._finish_narrow()

    @property
    def finished(self) -> bool:
        return bool(self.done.all())

    @property
    def planned_rounds(self) -> int:
        """The rounds this search expects: its open brackets cut down to their ε or to one
        float (a target between two order statistics may stop a round early or take one
        more)."""
        open_ = ~self.done
        return planned_rounds(self.lo[open_], self.hi[open_], self.epsilon[open_],
                              self.probes)

    @staticmethod
    def _value(order_keys: np.ndarray) -> np.ndarray:
        return float_order.values(order_keys)

    def _finish(self, mask: np.ndarray, values: np.ndarray) -> None:
        mask = mask & ~self.done
        self.value[mask] = values[mask]
        self.done |= mask

    def _finish_narrow(self) -> None:
        single = float_order.gap(self.lo, self.hi) <= np.uint64(1)
        self._finish(single, self._value(self.hi))
        low, high = self._value(self.lo), self._value(self.hi)
        with np.errstate(over="ignore", invalid="ignore"):  # unbounded: −inf, +inf
            narrow = high - low <= self.epsilon
            self._finish(narrow, low / 2 + high / 2)

    def probe(self) -> RankProbe:
        """Points inside each open bracket: K per target (K = 1: its midpoint), and a
        bracket that several targets of one feature share (early on, a feature's
        quartiles and the order statistics around each lie in one bracket) gets theirs
        together, as distinct points (:meth:`_shared`)."""
        points, leaders = self._shared()
        cuts = np.empty(int(points.sum()))
        offsets = np.cumsum(points) - points
        for count in np.unique(points):
            chosen = np.flatnonzero(points == count)
            slots = offsets[chosen, None] + np.arange(count)
            cuts[slots] = self._points(leaders[chosen], int(count))
        return RankProbe(features=np.repeat(self.features[leaders], points), points=cuts)

    def _shared(self) -> tuple[np.ndarray, np.ndarray]:
        """The open targets in groups (those of one feature with the same bracket): each
        group's points — K per target in it, at most :data:`~fednorm.protocols.base.
        MAX_RANK_PROBES` (or K) — and a target of it.  A feature is never asked for more
        points than K per open target (the party's :func:`probe_limit`), and every
        bracket still shrinks K + 1 times or more."""
        open_ = np.flatnonzero(~self.done)
        key = np.column_stack([self.features[open_].astype(np.int64), self.lo[open_],
                               self.hi[open_]])
        _, first, size = np.unique(key, axis=0, return_index=True, return_counts=True)
        points = np.minimum(size * self.probes, max(self.probes, MAX_RANK_PROBES))
        return points, open_[first]

    def _points(self, targets: np.ndarray, count: int) -> np.ndarray:
        """(targets, ``count``) probe points: lo·(1 − w) + hi·w (no overflow; (lo + hi) / 2
        for one point) for a target with ε > 0 that reaches ε in fewer rounds so than in
        the float order and where those points split its bracket, else ``count``
        thresholds evenly spaced in the float order (a bracket spanning many magnitudes,
        or unbounded)."""
        lo, hi = self.lo[targets], self.hi[targets]
        weights = np.arange(1, count + 1) / (count + 1)
        low, high = self._value(lo)[:, None], self._value(hi)[:, None]
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            by_value = float_order.keys(low * (1 - weights) + high * weights)
            sooner = np.log((high[:, 0] - low[:, 0]) / self.epsilon[targets]) \
                < np.log(float_order.gap(lo, hi).astype(np.float64))
        splits = (self.epsilon[targets] > 0) & sooner \
            & np.all((by_value > lo[:, None]) & (by_value <= hi[:, None]), axis=1) \
            & np.all(np.diff(by_value, axis=1) > 0, axis=1)
        cuts = np.where(splits[:, None], by_value, float_order.thresholds(lo, hi, count))
        return self._value(cuts)

    def update(self, probe: RankProbe, at_most: np.ndarray) -> None:
        """Narrow the open brackets with the pooled counts of values ≤ each point of
        ``probe`` (this search's own :meth:`probe`, made just before): one round."""
        points, _ = self._shared()
        if len(at_most) != points.sum() or len(probe.points) != points.sum():
            raise ProtocolError(f"expected {points.sum()} counts, got {len(at_most)}")
        self.rounds += 1
        self.narrow(probe, at_most)

    def narrow(self, probe: RankProbe, at_most: np.ndarray) -> None:
        """Narrow every open bracket with the pooled counts of values ≤ the points of any
        probe of its feature (a point outside a bracket changes nothing)."""
        features = np.asarray(probe.features, dtype=np.int64)
        keys = float_order.keys(np.asarray(probe.points, dtype=np.float64))
        counts = np.asarray(at_most, dtype=np.float64)
        open_ = np.flatnonzero(~self.done)
        for feature in np.unique(self.features[open_]):
            mine = features == feature
            order = np.argsort(keys[mine], kind="stable")
            self._narrow(open_[self.features[open_] == feature], keys[mine][order],
                         counts[mine][order])
        self._finish_narrow()

    def _narrow(self, targets: np.ndarray, points: np.ndarray, counts: np.ndarray) -> None:
        """Narrow ``targets`` (of one feature) by its points (keys, ascending) and their
        counts: x_(k) lies above the last point with fewer than k values at or below it
        and at or below the first with k or more."""
        if not len(points):
            return
        k = self.ranks[targets, None]
        # Gap rule: a probe with exactly k values at or below it lies in [x_(k), x_(k+1)).
        exact = self.gap[targets, None] & (counts[None, :] == k)
        in_gap = exact.any(axis=1)
        accepted = np.zeros(len(self.done), dtype=bool)
        accepted[targets[in_gap]] = True
        value = np.zeros(len(self.done))
        value[targets] = self._value(points[exact.argmax(axis=1)])
        self._finish(accepted, value)
        reached = counts[None, :] >= k
        first = np.where(reached.any(axis=1), reached.argmax(axis=1), len(points))
        above = points[np.minimum(first, len(points) - 1)]
        below = points[np.maximum(first - 1, 0)]
        lo, hi, keep = self.lo[targets], self.hi[targets], ~in_gap
        self.lo[targets] = np.where(keep & (first > 0), np.maximum(lo, below), lo)
        self.hi[targets] = np.where(keep & (first < len(points)), np.minimum(hi, above), hi)


def probe_limit(probes: int, quantiles: Sequence[float]) -> int:
    """The most points a round may probe per feature: ``probes`` per target, and a
    quantile has at most two targets (the order statistics around it)."""
    return probes * 2 * len(quantiles)


class SortedColumns:
    """A party's columns sorted once, so each round's counting is a binary search.

    With ``bounds`` (the global min and max, public once PPF MinMax has run) a party
    also refuses probes outside them and more rounds than :func:`round_limit` allows:
    each round reveals counts, so the ledger bounds both what and how often.
    """

    def __init__(self, X: np.ndarray, points_per_feature: int,
                 bounds: tuple[np.ndarray, np.ndarray] | None = None,
                 max_rounds: int | None = None) -> None:
        # counted in the float order (:mod:`.float_order`), as the server cuts: −0.0 < +0.0
        self._columns = [np.sort(float_order.keys(col[~np.isnan(col)])) for col in X.T]
        self._limit = points_per_feature
        self._bounds = bounds
        self._rounds_left = self._max_rounds = max_rounds

    def agree(self, points_per_feature: int, max_rounds: int) -> None:
        """Limits known only now (the unbounded search's opening is counted before n_g
        fixes the plan): the rounds answered so far count against ``max_rounds``."""
        answered = 0 if self._rounds_left is None else self._max_rounds - self._rounds_left
        self._limit, self._max_rounds = points_per_feature, max_rounds
        self._rounds_left = max_rounds - answered

    def count_at_most(self, probe: RankProbe) -> np.ndarray:
        """This party's counts of values ≤ each probe point; a round probing a feature at
        more points than agreed (:func:`probe_limit`) is refused, since each count it
        answers is one more value the ledger would not list."""
        features = np.asarray(probe.features, dtype=np.int64)
        if len(features) != len(probe.points) or (
            len(features) and (features.min() < 0 or features.max() >= len(self._columns))
        ):
            raise ProtocolError("rank probe names features this party does not have")
        if len(features) and np.bincount(features).max() > self._limit:
            raise ProtocolError(f"rank probe asks for more than {self._limit} points per "
                                "feature in one round")
        self._check_against_bounds(features, np.asarray(probe.points, dtype=np.float64))
        counts = np.empty(len(features), dtype=np.float64)
        points = float_order.keys(np.asarray(probe.points, dtype=np.float64))
        for i, (j, point) in enumerate(zip(features, points, strict=True)):
            counts[i] = np.searchsorted(self._columns[j], point, side="right")
        return counts


    def _check_against_bounds(self, features: np.ndarray, points: np.ndarray) -> None:
        if self._rounds_left is not None:
            if self._rounds_left <= 0:
                raise ProtocolError("the server asked for more search rounds than the "
                                    "agreed ε and bounds need")
            self._rounds_left -= 1
        if self._bounds is None or not len(features):
            return
        low, high = self._bounds[0][features], self._bounds[1][features]
        if not np.all((points >= low) & (points <= high) | ~np.isfinite(low + high)):
            raise ProtocolError("rank probe places a point outside the global min and max")


class CountAggregator(Protocol):
    """How the parties' per-round counts get pooled: in the clear, or encrypted."""

    async def pooled(self, ctx: RoleContext, width: int) -> np.ndarray:
        """Server: the summed counts of this round (``width`` of them)."""
        ...

    async def contribute(self, ctx: RoleContext, counts: np.ndarray) -> None:
        """Party: hand this round's local counts to the aggregation."""
        ...

    async def next_probe(self, ctx: RoleContext) -> RankProbe | RankDone:
        """Party: the server's next probe, or the end of the search."""
        ...


async def search_server(ctx: RoleContext, search: RankSearch, counts: CountAggregator
                        ) -> np.ndarray:
    """Server side of Algorithm 4: probe, pool the counts, narrow; until all are found."""
    with ctx.subprotocol("kth", planned_rounds=search.planned_rounds):
        while not search.finished:
            probe = search.probe()
            await ctx.broadcast(probe)
            search.update(probe, await counts.pooled(ctx, len(probe.points)))
        await ctx.broadcast(RankDone())
    return search.value


async def search_party(ctx: RoleContext, columns: SortedColumns, counts: CountAggregator
                       ) -> None:
    """Party side: answer every probe with local counts until the server says done."""
    with ctx.subprotocol("kth"):
        while isinstance(msg := await counts.next_probe(ctx), RankProbe):
            await counts.contribute(ctx, columns.count_at_most(msg))
