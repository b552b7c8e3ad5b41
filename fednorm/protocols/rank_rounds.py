"""How many rounds and points a rank search (:mod:`fednorm.protocols.rank`) may take:
the per-target precision, the points per target, and the round caps a party holds the
server to (each round reveals counts, so the ledger bounds how many and how often)."""

from __future__ import annotations

import numpy as np

from fednorm.protocols import float_order
from fednorm.protocols.base import FitOptions


def feature_epsilon(low: np.ndarray, high: np.ndarray, options: FitOptions) -> np.ndarray:
    """Per-feature search precision: the absolute ε if given, else relative to the range
    (it may underflow to 0 on subnormal data: the search then runs to a single float)."""
    if options.epsilon is not None:
        return np.full(len(low), options.epsilon)
    return high * options.relative_epsilon - low * options.relative_epsilon  # no overflow


def unbounded_round_limit(probes: int) -> int:
    """The most rounds :func:`start_unbounded_search` can take: from the whole float order
    to one float, plus the slack of :func:`round_limit`."""
    whole = float_order.keys(np.array([-np.inf, np.inf]))
    return float_order.rounds_to_single(whole[:1] - 1, whole[1:], probes) + 2


def options_probes(options: FitOptions, default: int = 1) -> int:
    """K: ``rank_probes``, or the protocol's ``default`` where the options leave it open."""
    return options.rank_probes or default


def round_limit(low: np.ndarray, high: np.ndarray, options: FitOptions) -> int:
    """The most rounds a search from [low, high] can take: each round cuts a bracket into
    ``rank_probes`` + 1 cells (in value while ε > 0, at most one round more in the float
    order at its spacing; in the float order with ε = 0), plus two rounds of slack (a
    target between two order statistics, a bracket that stops a little short)."""
    finite = np.isfinite(low) & np.isfinite(high) & (low <= high)
    low, high = np.where(finite, low, 0.0), np.where(finite, high, 0.0)
    epsilon = feature_epsilon(low, high, options)
    below, top = float_order.keys(low) - 1, float_order.keys(high)
    exact = epsilon <= 0
    by_value = rounds_to_narrow(np.where(exact, 0.0, high - low),
                                np.where(exact, 1.0, epsilon), options_probes(options))
    by_order = float_order.rounds_to_single(below[exact], top[exact], options_probes(options))
    return max(by_value, by_order) + 2


def planned_rounds(lo: np.ndarray, hi: np.ndarray, epsilon: np.ndarray, probes: int) -> int:
    """The rounds brackets (lo, hi] (order keys) are expected to take: each the fewer of
    narrowing in value to ε (no finer than the float spacing at its larger end) and of
    cutting it in the float order to one float (the only way where ε = 0)."""
    low, high = float_order.values(lo), float_order.values(hi)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        finest = np.spacing(np.maximum(np.abs(low), np.abs(high)))
        by_value = np.log(np.maximum((high - low) / np.maximum(epsilon, finest), 1.0))
    by_value = np.where(epsilon > 0, np.nan_to_num(by_value, nan=np.inf), np.inf)
    by_order = np.log(np.maximum(float_order.gap(lo, hi).astype(np.float64), 1.0))
    cuts = np.minimum(by_value, by_order) / np.log(probes + 1)
    return int(np.ceil(cuts.max(initial=0.0)))


def rounds_to_narrow(width: np.ndarray, epsilon: np.ndarray, probes: int) -> int:
    """Rounds until brackets ``width`` wide are at most ``epsilon``, each round cutting
    every bracket into ``probes`` + 1 cells."""
    cuts = np.log(np.maximum(width / epsilon, 1.0)) / np.log(probes + 1)
    return int(np.ceil(cuts.max(initial=0.0)))
