"""Hypothesis strategies shared by the protocol tests: pooled data and random splits."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

MAGNITUDES = (1e-6, 1e-3, 1.0, 1e3, 1e6, 1e9)
HOSTILE = ("normal", "constant", "ties", "offset", "zero_mean", "empty", "subnormal")
"""Every kind of column, the optional ones too: values and their negatives (mean exactly
0), no value at all, subnormals beside ±0."""


@dataclass
class Federation:
    """Pooled data and the same rows split over parties."""

    pooled: np.ndarray
    parts: list[np.ndarray]

    def __repr__(self) -> str:
        sizes = [len(p) for p in self.parts]
        return f"Federation(shape={self.pooled.shape}, sizes={sizes})"


def _column(rng: np.random.Generator, n: int, kind: str, magnitude: float) -> np.ndarray:
    if kind == "constant":
        return np.full(n, magnitude * rng.uniform(-3, 3))
    if kind == "ties":
        levels = rng.normal(0, magnitude, size=rng.integers(1, 4))
        return rng.choice(levels, size=n)
    if kind == "zero_mean":  # each value with its negative: the mean is exactly 0
        half = rng.normal(0, magnitude, size=n // 2)
        return rng.permutation(np.concatenate([half, -half, np.zeros(n % 2)]))
    if kind == "empty":
        return np.full(n, np.nan)
    if kind == "subnormal":
        return rng.choice([5e-324, -5e-324, 1e-310, -2e-315, 0.0, -0.0], size=n)
    if kind == "offset":  # huge mean, tiny spread: catastrophic cancellation territory
        return magnitude * 1e3 + rng.normal(0, magnitude * 1e-3, size=n)
    return rng.normal(rng.uniform(-2, 2) * magnitude, magnitude, size=n)


@st.composite
def federations(
    draw: st.DrawFn,
    max_parties: int = 30,
    max_features: int = 4,
    nan: bool = True,
    kinds: tuple[str, ...] = ("normal", "constant", "ties", "offset"),
    magnitudes: tuple[float, ...] = MAGNITUDES,
) -> Federation:
    parties = draw(st.integers(1, max_parties))
    n_rows = draw(st.integers(parties, parties + 80))
    n_features = draw(st.integers(1, max_features))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    columns = [
        _column(rng, n_rows, draw(st.sampled_from(kinds)), draw(st.sampled_from(magnitudes)))
        for _ in range(n_features)
    ]
    X = np.column_stack(columns)
    if nan and draw(st.booleans()):
        X[rng.random(X.shape) < draw(st.sampled_from([0.05, 0.3]))] = np.nan
    cuts = draw(
        st.lists(st.integers(1, n_rows - 1), min_size=parties - 1, max_size=parties - 1,
                 unique=True)
    ) if parties > 1 else []
    parts = np.split(X, sorted(cuts))
    return Federation(X, parts)
