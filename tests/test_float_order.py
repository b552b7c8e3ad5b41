"""The float64 order as integers, and the rank search that walks it: exact on subnormals,
signed zeros and magnitudes far apart, where halving in floating point stalls."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fednorm.protocols import float_order
from fednorm.protocols.base import FitOptions
from fednorm.protocols.quantiles import plan_quantiles
from fednorm.protocols.rank import SortedColumns, probe_limit, start_search, start_unbounded_search
from fednorm.protocols.rank_rounds import round_limit
from fednorm.sim.federation import simulate

finite = st.floats(allow_nan=False, allow_infinity=False)
arrays = hnp.arrays(np.float64, st.integers(1, 40), elements=finite)


@given(arrays)
def test_keys_order_like_the_values_and_round_trip(values: np.ndarray) -> None:
    keys = float_order.keys(values)
    assert np.array_equal(float_order.values(keys).view(np.int64), values.view(np.int64))
    order = np.argsort(keys, kind="stable")
    assert np.all(np.diff(values[order]) >= 0)


def test_neighbouring_floats_are_one_key_apart() -> None:
    points = np.array([-np.inf, -1.0, -5e-324, -0.0, 0.0, 5e-324, 1.0, np.finfo(float).max])
    keys = float_order.keys(points)
    assert np.all(np.diff(keys) > 0)
    assert keys[4] - keys[3] == 1 and keys[5] - keys[4] == 1
    assert float_order.keys(np.nextafter(1.0, 2.0))[()] - keys[6] == 1


@given(finite, finite, st.integers(1, 20))
def test_thresholds_cut_a_bracket_into_near_equal_cells(a: float, b: float, count: int
                                                        ) -> None:
    low, high = float_order.keys(np.array([min(a, b), max(a, b)]))
    cuts = float_order.thresholds(np.array([low]), np.array([high]), count)[0]
    edges = np.concatenate([[low], cuts, [high]])
    assert np.all(np.diff(edges) >= 0) and cuts.min() >= low and cuts.max() <= high
    span = int(high) - int(low)
    assert max(np.diff(edges).astype(object)) <= -(-span // (count + 1))


@given(st.integers(0, 2**63), st.integers(1, 30))
def test_rounds_to_single_is_what_the_cells_give(span: int, count: int) -> None:
    low, high = np.array([-(2**62)]), np.array([-(2**62) + span])
    rounds, widest = 0, span
    while widest > 1:
        widest = int(max(np.diff(np.concatenate(
            [[0], float_order.thresholds(np.array([0]), np.array([widest]), count)[0],
             [widest]]))))
        rounds += 1
    assert float_order.rounds_to_single(low, high, count) == rounds


def _search_exactly(parts: list[np.ndarray], probes: int) -> np.ndarray:
    """Plain robust scaling's quartiles, exact (ε = 0: the search ends on one float)."""
    options = FitOptions(epsilon=None, relative_epsilon=0.0, rank_probes=probes)
    fitted = simulate(parts, "robust", options=options).normalizer
    return np.vstack([fitted.q1, fitted.median, fitted.q3])


@pytest.mark.parametrize("probes", [1, 3])
def test_plain_robust_is_exact_on_subnormals(probes: int) -> None:
    """A feature of subnormals (±1e-322): before, q3 came out 0.0 against numpy's
    1.33e-322, an error of 0.28 of the feature's range."""
    rng = np.random.default_rng(5)
    pooled = rng.choice([-1e-322, -3e-323, 0.0, 2e-323, 1e-322, 5e-324], size=(40, 1))
    parts = [pooled[:13], pooled[13:27], pooled[27:]]
    want = np.quantile(pooled, [0.25, 0.5, 0.75], axis=0)
    assert np.array_equal(_search_exactly(parts, probes), want)


@settings(max_examples=25, deadline=None)
@given(hnp.arrays(np.float64, (24, 2), elements=st.one_of(
    finite, st.sampled_from([0.0, -0.0, 5e-324, -1e-310, 1e-300, 1e300]))))
def test_plain_robust_quartiles_equal_numpys_on_any_finite_values(pooled: np.ndarray
                                                                  ) -> None:
    """Huge and tiny magnitudes side by side, signed zeros, ties: the quartiles are
    numpy's (its interpolation arithmetic on the exact order statistics)."""
    want = np.quantile(pooled, [0.25, 0.5, 0.75], axis=0)
    with np.errstate(all="ignore"):
        got = _search_exactly([pooled[:7], pooled[7:8], pooled[8:]], 1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("epsilon", [1e-30, 0.0])
def test_a_search_never_runs_past_its_stated_plan(epsilon: float) -> None:
    """ε far below the float spacing, or exact: the search ends on one float (the order
    statistic itself) within the parties' round cap (``round_limit``), and exact
    bisection within 64 rounds."""
    X = np.linspace(1.0, 1e6, 50)[:, None]
    counts, low, high = np.array([50.0]), X.min(axis=0), X.max(axis=0)
    options = FitOptions(epsilon=epsilon or None, relative_epsilon=0.0)
    search = start_search(plan_quantiles(counts, [0.25, 0.5, 0.75]), counts, low, high,
                          options)
    columns = SortedColumns(X, 8)
    while not search.finished:
        probe = search.probe()
        search.update(probe, columns.count_at_most(probe))
    assert search.rounds <= round_limit(low, high, options)
    assert epsilon or search.rounds <= 64
    np.testing.assert_array_equal(search.value, np.sort(X[:, 0])[search.ranks - 1])


def test_targets_in_one_bracket_share_distinct_points_and_finish_sooner() -> None:
    """A feature's six targets (three quartiles, two order statistics each) start in one
    bracket, the whole float order: the first probe holds six distinct points, not six
    copies of one midpoint (never more than K = 1 per target, what a party allows), and
    the exact search ends on numpy's order statistics in fewer rounds than bisection's
    64 for each target alone."""
    X = np.random.default_rng(3).normal(size=(40, 1))
    counts = np.array([40.0])
    search = start_unbounded_search(plan_quantiles(counts, [0.25, 0.5, 0.75]), counts,
                                    FitOptions(relative_epsilon=0.0), probes=1)
    first = search.probe()
    assert len(search.features) == 6
    assert len(np.unique(first.points)) == len(first.points) == 6
    columns = SortedColumns(X, probe_limit(1, [0.25, 0.5, 0.75]))
    while not search.finished:
        probe = search.probe()
        search.update(probe, columns.count_at_most(probe))
    np.testing.assert_array_equal(search.value, np.sort(X[:, 0])[search.ranks - 1])
    assert search.rounds < 64
