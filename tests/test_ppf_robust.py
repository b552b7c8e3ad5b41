"""PPF robust scaling (Alg. 3 on Alg. 4) against numpy's pooled quartiles."""

from __future__ import annotations

import numpy as np
import pytest

from fednorm.engine.errors import InputError
from fednorm.protocols import FitOptions
from fednorm.sim.federation import simulate


def test_ppf_robust_quartiles_equal_pooled_within_epsilon() -> None:
    rng = np.random.default_rng(7)
    parts = [rng.normal(-2, 3, size=(n, 2)) for n in (30, 1, 17)]  # one party has one row
    parts[0][3, 1] = np.nan
    pooled = np.vstack(parts)
    epsilon = 1e-4
    expected = np.nanpercentile(pooled, [25, 50, 75], axis=0)
    rounds = {}
    for probes in (1, 15):
        options = FitOptions(preset="test", vabs=(50.0,), epsilon=epsilon, rank_probes=probes)
        result = simulate(parts, "robust", "mhe", options)
        fitted = result.normalizer
        # Each order statistic is within ε/2 of the truth once the bracket is narrower than
        # ε; the brackets start from PPF MinMax, whose error is far below ε here.
        for got, want in zip((fitted.q1, fitted.median, fitted.q3), expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=epsilon)
        rounds[probes] = result.report.rounds
    # The search narrows ~17 bits (range ~20 down to 1e-4): ~17 rounds by bisection, ~5 with
    # 15 probes (4 bits a round); everything else is the same.
    assert rounds[15] <= rounds[1] - 10, rounds


def test_ppf_robust_needs_the_agreed_bound() -> None:
    with pytest.raises(InputError, match=r"(?i)v_?abs"):
        simulate([np.ones((3, 1)), np.ones((3, 1))], "robust", "mhe", FitOptions(preset="test"))
