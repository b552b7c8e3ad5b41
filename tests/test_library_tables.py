"""The library as people call it with pandas: columns matched by name (never pooled by
position into a wrong fit), names kept through to scikit-learn, and inputs that are
accepted or refused naming the argument.  Oracle: scikit-learn on the pooled frame."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler, StandardScaler

from fednorm.engine.errors import InputError
from fednorm.protocols import FitOptions
from fednorm.sim.federation import simulate, simulate_session

COLUMNS = ["age", "dose", "weight"]


def party_frames(sizes: tuple[int, ...], seed: int = 0) -> list[pd.DataFrame]:
    """Parties on different scales per column, so a column mixed up with another one
    moves the pooled statistics far."""
    rng = np.random.default_rng(seed)
    return [pd.DataFrame({"age": rng.normal(50 + 5 * i, 10, n),
                          "dose": rng.exponential(2.0 + i, n),
                          "weight": rng.normal(1000.0, 100.0, n)}) for i, n in enumerate(sizes)]


@settings(max_examples=12, deadline=None)
@given(orders=st.lists(st.permutations(COLUMNS), min_size=2, max_size=4),
       method=st.sampled_from(["zscore", "minmax"]))
def test_parties_whose_columns_are_ordered_differently_fit_the_pooled_frame(
    orders: list[list[str]], method: str
) -> None:
    frames = party_frames(tuple(7 + 3 * i for i in range(len(orders))))
    shuffled = [frame[order] for frame, order in zip(frames, orders, strict=True)]
    fitted = simulate(shuffled, method).normalizer
    pooled = pd.concat(frames)[list(orders[0])]  # the first party's order is the fit's
    oracle = (StandardScaler() if method == "zscore" else MinMaxScaler()).fit(pooled)
    assert fitted.feature_names == tuple(orders[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "X has feature names, but ... fitted without"
        ours = fitted.to_sklearn().transform(pooled)
    np.testing.assert_allclose(ours, oracle.transform(pooled), rtol=1e-9, atol=1e-9)


def test_a_party_whose_columns_are_named_differently_is_refused_naming_them() -> None:
    frames = party_frames((10, 12))
    renamed = frames[1].rename(columns={"dose": "dosage"})
    with pytest.raises(InputError, match=r"party 2's columns differ from the federation's: "
                                         r"lacks 'dose' and has unexpected 'dosage'"):
        simulate([frames[0], renamed])
    with pytest.raises(InputError, match=r"party 2's columns .* lacks 'weight'"):
        simulate_session([frames[0], frames[1][["age", "dose"]]], ["zscore"], "plain")


def test_fitted_objects_carry_the_names_through_scikit_learn_conventions() -> None:
    frames = party_frames((10, 12))
    scaler = simulate(frames, "zscore").normalizer.to_sklearn()
    assert list(scaler.feature_names_in_) == COLUMNS and scaler.n_features_in_ == 3
    assert list(scaler.get_feature_names_out()) == COLUMNS
    out = scaler.set_output(transform="pandas").transform(frames[0])
    assert isinstance(out, pd.DataFrame) and list(out.columns) == COLUMNS
    with pytest.raises(ValueError, match="feature names"):  # scikit-learn's own name check
        scaler.transform(frames[0][["dose", "age", "weight"]])


def test_a_federated_scaler_stays_fitted_inside_a_pipeline() -> None:
    """The documented way: freeze it, so the pipeline's fit on one party's rows does not
    refit it on those rows alone."""
    from sklearn.frozen import FrozenEstimator
    from sklearn.linear_model import LinearRegression

    frames = party_frames((30, 40))
    scaler = simulate(frames, "zscore").normalizer.to_sklearn()
    local = frames[0]
    pipeline = make_pipeline(FrozenEstimator(scaler), LinearRegression())
    pipeline.fit(local, local["weight"] * 2.0)
    np.testing.assert_array_equal(pipeline[0].transform(local), scaler.transform(local))
    assert not np.allclose(scaler.mean_, local.mean())  # the federation's, not party 1's


def test_the_normalizer_transform_matches_frames_by_name() -> None:
    frames = party_frames((10, 12))
    fitted = simulate(frames, "minmax").normalizer
    np.testing.assert_array_equal(fitted.transform(frames[1][["weight", "age", "dose"]]),
                                  fitted.transform(frames[1].to_numpy()))
    with pytest.raises(InputError, match="lacks 'weight'"):
        fitted.transform(frames[1][["age", "dose"]])


def test_inputs_are_accepted_or_refused_naming_the_argument() -> None:
    frames = party_frames((10, 12))
    with pytest.raises(InputError, match="party_data takes one array or DataFrame per "
                                         r"party, in a list; got a single DataFrame"):
        simulate(frames[0])  # type: ignore[arg-type]
    with pytest.raises(InputError, match="got a single array"):
        simulate(frames[0].to_numpy())  # type: ignore[arg-type]
    with pytest.raises(InputError, match="mixes DataFrames with unnamed arrays"):
        simulate([frames[0], frames[1].to_numpy()])
    with pytest.raises(InputError, match=r"party 2's column 'dose' is not numeric"):
        simulate([frames[0], frames[1].astype({"dose": str})])
    twice = frames[1].set_axis(["age", "age", "weight"], axis=1)
    with pytest.raises(InputError, match="party 2 has more than one column named 'age'"):
        simulate([frames[0], twice])
    # Lists of rows are arrays; one number is V_abs for every feature.
    lists = [frame.to_numpy().tolist() for frame in frames]
    np.testing.assert_allclose(simulate(lists).normalizer.mean,
                               pd.concat(frames).mean().to_numpy(), rtol=1e-12)
    assert FitOptions(vabs=100.0).vabs == (100.0,)
    assert FitOptions(vabs=np.array([1, 2])).vabs == (1.0, 2.0)
    for bad in ("100", True, [], [1.0, -1.0], {"a": 1.0}):
        with pytest.raises(InputError, match="vabs"):
            FitOptions(vabs=bad)  # type: ignore[arg-type]


def test_pandas_nullable_columns_are_numbers_with_missing_values() -> None:
    frames = party_frames((10, 12))
    nullable = frames[1].assign(dose=pd.array([1, None, *range(10)], dtype="Int64"))
    fitted = simulate([frames[0], nullable], "zscore").normalizer
    pooled = pd.concat([frames[0], nullable.astype("float64")])
    np.testing.assert_allclose(fitted.mean, pooled.mean().to_numpy(), rtol=1e-12)


def test_a_v_abs_refusal_names_the_frame_s_columns() -> None:
    frames = party_frames((10, 12))
    options = FitOptions(algorithm="paper", vabs=500.0, preset="test")
    with pytest.raises(InputError, match="'weight'"):
        simulate(frames, "minmax", "mhe", options)


def test_partial_fit_carries_on_from_a_counted_fit_and_says_why_it_cannot_otherwise() -> None:
    from fednorm.protocols.plain.minmax import fit_local

    frames = party_frames((10, 12))
    more = party_frames((5,), seed=1)[0]
    counted = fit_local(frames[0].to_numpy(), FitOptions()).to_sklearn()  # counts its rows
    oracle = MinMaxScaler().fit(frames[0]).partial_fit(more)
    np.testing.assert_array_equal(counted.partial_fit(more.to_numpy()).data_max_,
                                  oracle.data_max_)
    assert counted.n_samples_seen_ == oracle.n_samples_seen_
    for privacy in ("plain", "mhe"):  # no federated MinMax learns the pooled row count
        fitted = simulate(frames, "minmax", privacy, FitOptions(preset="test")).normalizer
        assert fitted.rows is None
        with pytest.raises(ValueError, match="without revealing the pooled row count"):
            fitted.to_sklearn().partial_fit(more)


def test_to_sklearn_without_scikit_learn_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    fitted = simulate(party_frames((10, 12)), "robust").normalizer
    monkeypatch.setitem(sys.modules, "sklearn.preprocessing", None)  # as if not installed
    with pytest.raises(InputError, match=r"needs scikit-learn.*pip install 'fednorm\[sklearn\]'"):
        fitted.to_sklearn()
