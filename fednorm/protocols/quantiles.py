"""Which order statistics a set of quantiles needs, and how to combine them.

Quantiles follow numpy's / scikit-learn's linear interpolation between the two order
statistics around position q·(n−1); the paper's rule — accept any value in the gap
between those two — is ``quantile_rule="gap"``.  The rank search
(:mod:`fednorm.protocols.rank`) finds the order statistics a :class:`QuantilePlan` names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fednorm.protocols.base import QuantileRule


@dataclass(frozen=True)
class QuantilePlan:
    """Which order statistics a set of quantiles needs, and how to combine them."""

    features: np.ndarray  # per target: feature index
    ranks: np.ndarray  # per target: 1-based rank k
    gap: np.ndarray  # per target: True → accept any value in [x_(k), x_(k+1))
    lower: np.ndarray  # (quantiles, features): target index of x_(floor)
    upper: np.ndarray  # (quantiles, features): target index of x_(floor+1), or -1
    fraction: np.ndarray  # (quantiles, features): interpolation weight of upper

    def combine(self, values: np.ndarray) -> np.ndarray:
        """Quantiles (quantiles, features) from the found target values."""
        padded = np.append(values, np.nan)  # index -1: a feature without values → NaN
        low = padded[self.lower]
        high = np.where(self.upper >= 0, padded[self.upper], low)
        return low + self.fraction * (high - low)


def plan_quantiles(
    counts: np.ndarray, quantiles: Sequence[float], rule: QuantileRule = "interpolate"
) -> QuantilePlan:
    """Targets for ``quantiles`` of every feature with ``counts[j]`` values.

    Features without values get no targets (their quantiles come out NaN).
    """
    targets: dict[tuple[int, int, bool], int] = {}
    shape = (len(quantiles), len(counts))
    lower = np.full(shape, -1, dtype=np.int64)
    upper = np.full(shape, -1, dtype=np.int64)
    fraction = np.zeros(shape)

    def target(feature: int, rank: int, gap: bool = False) -> int:
        return targets.setdefault((feature, rank, gap), len(targets))

    for qi, q in enumerate(quantiles):
        for j, n in enumerate(counts.astype(np.int64)):
            if n <= 0:
                continue
            position = q * (n - 1)
            floor = int(np.floor(position))
            frac = position - floor
            if frac > 0 and rule == "gap":
                lower[qi, j] = target(j, floor + 1, gap=True)
            else:
                lower[qi, j] = target(j, floor + 1)
                if frac > 0:
                    upper[qi, j] = target(j, floor + 2)
                    fraction[qi, j] = frac
    keys = list(targets)
    return QuantilePlan(
        features=np.array([k[0] for k in keys], dtype=np.int64),
        ranks=np.array([k[1] for k in keys], dtype=np.int64),
        gap=np.array([k[2] for k in keys], dtype=bool),
        lower=lower, upper=upper, fraction=fraction,
    )
