"""Plaintext federated protocols against the pooled numpy / scikit-learn oracle."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.preprocessing import MinMaxScaler, RobustScaler, StandardScaler
from strategies import Federation, federations

from fednorm.engine.errors import InputError
from fednorm.protocols import FitOptions, fit_local
from fednorm.sim.federation import simulate

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _nan_stat(fn, X: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(X.astype(np.longdouble), axis=0).astype(np.float64)


def _spread(X: np.ndarray) -> np.ndarray:
    """Largest magnitude per feature: the scale that summation error is relative to."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nan_to_num(np.nanmax(np.abs(X), axis=0))


@SETTINGS
@given(federations())
def test_zscore_equals_pooled_mean_and_variance(federation: Federation) -> None:
    result = simulate(federation.parts, "zscore").normalizer
    mean, var = _nan_stat(np.nanmean, federation.pooled), _nan_stat(np.nanvar, federation.pooled)
    scale = _spread(federation.pooled)
    assert np.array_equal(np.isnan(result.mean), np.isnan(mean))
    assert np.all(np.abs(result.mean - mean)[~np.isnan(mean)] <= 1e-9 * scale[~np.isnan(mean)])
    # Variance: relative 1e-9, plus an absolute floor at float64 resolution of x².
    ok = ~np.isnan(var)
    assert np.all(np.abs(result.var - var)[ok] <= 1e-9 * var[ok] + 1e-15 * scale[ok] ** 2)


@SETTINGS
@given(federations())
def test_minmax_equals_pooled_extremes_exactly(federation: Federation) -> None:
    result = simulate(federation.parts, "minmax").normalizer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        np.testing.assert_array_equal(result.min, np.nanmin(federation.pooled, axis=0))
        np.testing.assert_array_equal(result.max, np.nanmax(federation.pooled, axis=0))


@SETTINGS
@given(federations(), st.sampled_from([None, 1e-3]), st.sampled_from([1, 2, 7]))
def test_robust_quartiles_equal_robust_scaler_within_epsilon(
    federation: Federation, epsilon: float | None, probes: int
) -> None:
    options = FitOptions(epsilon=epsilon, rank_probes=probes)
    result = simulate(federation.parts, "robust", options=options).normalizer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        q1, median, q3 = np.nanpercentile(federation.pooled, [25, 50, 75], axis=0)
        low, high = np.nanmin(federation.pooled, axis=0), np.nanmax(federation.pooled, axis=0)
    eps = epsilon if epsilon is not None else 1e-9 * (high - low)
    ok = ~np.isnan(median)
    for found, expected in ((result.q1, q1), (result.median, median), (result.q3, q3)):
        # Each order statistic is within ε/2, so the interpolated quartile is within ε.
        assert np.all(np.abs(found - expected)[ok] <= np.broadcast_to(eps, ok.shape)[ok] + 1e-300)
    assert np.all(np.isnan(result.median[~ok]))


def test_robust_matches_sklearn_robust_scaler_on_bcw() -> None:
    from fednorm.sim.datasets import load_dataset
    from fednorm.sim.partition import partition

    data = load_dataset("bcw")
    parts = [p.X for p in partition(data.X, data.y, 10, "label:0.5", seed=3)]
    fitted = simulate(parts, "robust").normalizer
    scaler = RobustScaler().fit(data.X)
    eps = 1e-9 * (data.X.max(axis=0) - data.X.min(axis=0))
    assert np.all(np.abs(fitted.median - scaler.center_) <= eps)
    assert np.all(np.abs((fitted.q3 - fitted.q1) - scaler.scale_) <= 2 * eps)
    np.testing.assert_allclose(fitted.to_sklearn().transform(data.X), scaler.transform(data.X),
                               rtol=1e-6, atol=1e-6)


def test_multi_probe_search_needs_fewer_rounds_for_the_same_precision() -> None:
    from fednorm.sim.datasets import load_dataset
    from fednorm.sim.partition import partition

    data = load_dataset("bcw")
    parts = [p.X for p in partition(data.X, data.y, 5, "iid", seed=0)]
    eps = 1e-9 * (data.X.max(axis=0) - data.X.min(axis=0))
    expected = np.percentile(data.X, [25, 50, 75], axis=0)
    rounds = {}
    for probes in (1, 15):
        result = simulate(parts, "robust", options=FitOptions(rank_probes=probes))
        fitted = result.normalizer
        for got, want in zip((fitted.q1, fitted.median, fitted.q3), expected, strict=True):
            assert np.all(np.abs(got - want) <= eps)
        rounds[probes] = result.report.rounds
    # 30 bits of bracket: ~30 search rounds by bisection, ~8 with 15 probes (4 bits each).
    assert rounds[15] <= rounds[1] - 20


@pytest.mark.parametrize("probes", [0, 256])
def test_rank_probes_out_of_range_is_an_input_error(probes: int) -> None:
    with pytest.raises(InputError, match="rank_probes"):
        FitOptions(rank_probes=probes)


@pytest.mark.parametrize("probes", [1, 4])
def test_a_party_answers_no_more_probe_points_per_feature_than_agreed(probes: int) -> None:
    from fednorm.engine.errors import ProtocolError
    from fednorm.protocols.rank import RankProbe, SortedColumns, probe_limit

    columns = SortedColumns(np.arange(12.0).reshape(6, 2), probe_limit(probes, (0.25, 0.75)))
    agreed = 4 * probes  # two quartiles, at most two ranks each, K points per rank
    points = np.linspace(0, 10, agreed)
    answered = columns.count_at_most(RankProbe(features=np.zeros(agreed, dtype=np.int64),
                                               points=points))
    np.testing.assert_array_equal(answered, [np.sum(np.arange(0, 12, 2) <= p) for p in points])
    with pytest.raises(ProtocolError, match="more than"):
        columns.count_at_most(RankProbe(features=np.zeros(agreed + 1, dtype=np.int64),
                                        points=np.linspace(0, 10, agreed + 1)))


@pytest.mark.parametrize("probes", [1, 3])
def test_gap_rule_returns_a_value_between_the_middle_order_statistics(probes: int) -> None:
    parts = [np.array([[1.0], [2.0]]), np.array([[10.0], [20.0]])]
    options = FitOptions(quantile_rule="gap", rank_probes=probes)
    median = simulate(parts, "robust", options=options).normalizer.median
    assert 2.0 <= median[0] < 10.0  # interpolation would give exactly 6.0
    interpolated = simulate(parts, "robust").normalizer.median
    assert abs(interpolated[0] - 6.0) <= 1e-9 * 19


@given(federations(max_parties=5, nan=False, kinds=("normal",), magnitudes=(1.0, 1e3)))
@settings(max_examples=20, deadline=None)
def test_fitted_normalizers_transform_like_sklearn(federation: Federation) -> None:
    pooled = federation.pooled
    zscore = simulate(federation.parts, "zscore").normalizer
    np.testing.assert_allclose(zscore.transform(pooled),
                               StandardScaler().fit(pooled).transform(pooled), atol=1e-8)
    np.testing.assert_allclose(zscore.to_sklearn().transform(pooled), zscore.transform(pooled))
    minmax = simulate(federation.parts, "minmax").normalizer
    np.testing.assert_allclose(minmax.transform(pooled),
                               MinMaxScaler().fit(pooled).transform(pooled), atol=1e-12)
    np.testing.assert_allclose(minmax.to_sklearn().transform(pooled), minmax.transform(pooled))


@pytest.mark.parametrize("method", ["zscore", "minmax", "robust"])
def test_one_party_federation_equals_local_fit(method: str) -> None:
    X = np.random.default_rng(0).normal(size=(40, 3))
    federated = simulate([X], method).normalizer.params()
    local = fit_local(method, X).params()
    # Quantiles come from a search with ε = 1e-9 × range; the rest is exact arithmetic.
    atol = 1e-9 * float(np.ptp(X)) if method == "robust" else 1e-12
    for name in local:
        np.testing.assert_allclose(federated[name], local[name], rtol=1e-12, atol=atol)


def test_local_fit_differs_from_federated_under_feature_skew() -> None:
    rng = np.random.default_rng(1)
    parts = [rng.normal(loc=i, size=(30, 2)) for i in range(3)]
    federated = simulate(parts, "zscore").normalizer
    local = fit_local("zscore", parts[0])
    assert np.all(np.abs(local.mean - federated.mean) > 0.5)


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([], "at least one party"),
        ([np.ones((3, 2)), np.ones((3, 3))], "disagree on the number of features"),
        ([np.ones(3)], "2-D"),
        ([np.array([[1.0, np.inf]])], "infinite"),
    ],
)
def test_bad_federation_input_is_rejected_before_running(parts, message) -> None:
    with pytest.raises(InputError, match=message):
        simulate(parts, "zscore")


def test_unknown_method_and_privacy_are_input_errors() -> None:
    with pytest.raises(InputError, match="unknown method"):
        simulate([np.ones((2, 2))], "quantile")
    with pytest.raises(InputError, match="unknown privacy"):
        simulate([np.ones((2, 2))], "zscore", privacy="secret")


@pytest.mark.parametrize(("options", "message"), [
    ({"epsilon": float("inf")}, "epsilon must be a finite positive number"),
    ({"epsilon": 0.0}, "epsilon must be a finite positive number"),
    ({"vabs": (1.0, float("nan"))}, "vabs bounds must be finite positive"),
    ({"vabs": (0.0,)}, "vabs bounds must be finite positive"),
    ({"flooding_bits": 19}, ">= 20 bits"),
])
def test_fit_options_refuse_what_no_protocol_can_use(options, message) -> None:
    with pytest.raises(InputError, match=message):
        FitOptions(**options)


def test_complex_party_data_is_refused_not_truncated() -> None:
    with pytest.raises(InputError, match="complex"):
        fit_local("zscore", np.ones((3, 2)) + 1j)


@pytest.mark.parametrize("probes", [1, 3, 15])
def test_the_search_announces_the_rounds_it_then_takes(probes: int) -> None:
    """The rank search's planned rounds (shown as 'round k of ~n' by the progress line)
    are at most one round short of what it takes, and within the parties' round limit
    (the plan counts K points per target; targets that share a bracket in the first
    rounds share their points, and may end a few rounds sooner)."""
    from fednorm.protocols.quantiles import plan_quantiles
    from fednorm.protocols.rank import SortedColumns, start_search
    from fednorm.protocols.rank_rounds import round_limit

    X = np.random.default_rng(6).normal(size=(500, 3)) * [1.0, 1e-3, 1e6]
    options = FitOptions(epsilon=None, relative_epsilon=1e-6, rank_probes=probes)
    count = np.full(3, 500.0)
    low, high = X.min(axis=0), X.max(axis=0)
    plan = plan_quantiles(count, (0.25, 0.5, 0.75))
    search = start_search(plan, count, low, high, options)
    planned = search.planned_rounds
    columns = SortedColumns(X, 1000)
    while not search.finished:
        probe = search.probe()
        search.update(probe, columns.count_at_most(probe))
    assert search.rounds <= planned + 1
    assert planned <= round_limit(low, high, options)
