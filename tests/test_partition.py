"""Tests of the non-IID partitioners: coverage, determinism, skew strength and input checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fednorm.engine.errors import InputError
from fednorm.sim.partition import (
    Partition,
    SplitSpec,
    describe,
    feature_spread,
    partition,
)

ALL_SPLITS = ["iid", "label:0.5", "quantity:0.5", "feature:1"]


def make_data(n_rows: int, n_classes: int = 4, n_features: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_rows, n_features))
    y = np.arange(n_rows) % n_classes  # balanced classes, every class present
    return X, y


def all_indices(parts: list[Partition]) -> np.ndarray:
    return np.concatenate([part.indices for part in parts])


def label_histogram(labels: np.ndarray, n_classes: int) -> np.ndarray:
    counts = np.bincount(labels, minlength=n_classes)
    return counts / counts.sum()


def mean_label_skew(parts: list[Partition], y: np.ndarray, n_classes: int) -> float:
    """Mean total-variation distance between each party's label mix and the global one."""
    overall = label_histogram(y, n_classes)
    return float(
        np.mean([0.5 * np.abs(label_histogram(p.y, n_classes) - overall).sum() for p in parts])
    )


def coefficient_of_variation(parts: list[Partition]) -> float:
    sizes = np.array([len(part.indices) for part in parts], dtype=float)
    return float(sizes.std() / sizes.mean())


# --- coverage and determinism ------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    parties=st.integers(1, 8),
    min_samples=st.integers(1, 12),
    spare_rows=st.integers(0, 150),
    kind=st.sampled_from(["iid", "label", "quantity", "feature"]),
    param=st.floats(0.01, 10.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_row_goes_to_exactly_one_party_with_at_least_min_samples(
    parties, min_samples, spare_rows, kind, param, seed
):
    # Any β, however skewed: short parties are topped up, so parties · min rows suffice.
    n_rows = parties * min_samples + spare_rows
    X, y = make_data(n_rows)
    split = SplitSpec("iid") if kind == "iid" else SplitSpec(kind, param)
    parts = partition(X, y, parties, split, seed=seed, min_samples=min_samples)

    assert len(parts) == parties
    assert sorted(all_indices(parts).tolist()) == list(range(n_rows))
    for part in parts:
        assert len(part.indices) >= min_samples
        assert part.X.shape == (len(part.indices), X.shape[1])
        np.testing.assert_array_equal(part.y, y[part.indices])
        if kind != "feature":
            np.testing.assert_array_equal(part.X, X[part.indices])


@pytest.mark.parametrize("split", ALL_SPLITS)
def test_same_seed_gives_identical_split_and_another_seed_a_different_one(split):
    X, y = make_data(200)
    first = partition(X, y, 4, split, seed=7)
    again = partition(X, y, 4, split, seed=7)
    other = partition(X, y, 4, split, seed=8)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.X, b.X)
    assert any(not np.array_equal(a.indices, b.indices) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("split", ALL_SPLITS)
def test_inputs_are_never_modified(split):
    X, y = make_data(120)
    X[3, 1] = np.nan
    X_before, y_before = X.copy(), y.copy()
    parts = partition(X, y, 3, split, seed=1)
    for part in parts:
        part.X[:] = 0.0  # a party's rows are its own copy
    np.testing.assert_array_equal(X, X_before)
    np.testing.assert_array_equal(y, y_before)


def test_iid_sizes_differ_by_at_most_one():
    X, y = make_data(103)
    sizes = [len(part.indices) for part in partition(X, y, 5, "iid")]
    assert max(sizes) - min(sizes) <= 1


def test_y_may_be_absent_except_for_label_skew():
    X, _ = make_data(50)
    for split in ["iid", "quantity:1", "feature:0.5"]:
        assert all(part.y is None for part in partition(X, None, 3, split))
    with pytest.raises(InputError, match="needs a target"):
        partition(X, None, 3, "label:1")


# --- skew strength -----------------------------------------------------------------------


def test_label_skew_at_small_beta_is_much_stronger_than_iid():
    n_classes = 10
    X, y = make_data(3000, n_classes=n_classes)
    iid = mean_label_skew(partition(X, y, 10, "iid", seed=3), y, n_classes)
    skewed = mean_label_skew(partition(X, y, 10, "label:0.1", seed=3), y, n_classes)
    assert iid < 0.1
    assert skewed > 0.4
    assert skewed > 4 * iid


def test_label_skew_weakens_as_beta_grows():
    n_classes = 10
    X, y = make_data(3000, n_classes=n_classes)
    skews = [
        np.mean(
            [
                mean_label_skew(partition(X, y, 10, f"label:{beta}", seed=s), y, n_classes)
                for s in range(5)
            ]
        )
        for beta in (0.1, 1.0, 100.0)
    ]
    assert skews[0] > skews[1] > skews[2]


def test_label_skew_bins_a_continuous_target():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 2))
    y = rng.normal(size=2000)  # 2000 distinct floats: no classes, so quantile bins
    bins = np.searchsorted(np.quantile(y, np.linspace(0, 1, 11)[1:-1]), y, side="right")

    def bin_skew(split: str) -> float:
        parts = partition(X, y, 8, split, seed=1)
        binned = [Partition(p.X, bins[p.indices], p.indices) for p in parts]
        return mean_label_skew(binned, bins, 10)

    assert bin_skew("label:0.1") > 0.4
    # Near-uniform proportions spread every bin evenly, as for IID; without binning each
    # distinct value would be a one-row class, and that spread would be lost.
    assert bin_skew("label:100") < 0.1
    assert bin_skew("iid") < 0.1
    counts = describe(partition(X, y, 8, "label:0.1", seed=1))["label_counts"]
    assert set().union(*counts) <= set(range(10))


@pytest.mark.parametrize("seed", range(5))
def test_label_skew_stops_feeding_a_party_once_it_has_its_fair_share(seed):
    # NIID-Bench's cap: a party at n / parties rows gets none of the later classes, so no
    # party can exceed its fair share by more than one class's worth of rows.
    X, y = make_data(3000, n_classes=10)
    sizes = [len(p.indices) for p in partition(X, y, 10, "label:0.1", seed=seed)]
    assert max(sizes) <= 3000 / 10 + 300


def test_label_skew_with_tiny_classes_follows_proportions_not_party_order():
    # 2000 one-row classes (an integer target, so not binned): with near-uniform Dir(1000)
    # proportions each row should land on a random party. Rounding every remainder to the
    # last party instead would fill parties with contiguous runs of the target.
    X, _ = make_data(2000)
    y = np.arange(2000)
    deciles = y // 200
    parts = partition(X, y, 8, "label:1000", seed=2)
    binned = [Partition(p.X, deciles[p.indices], p.indices) for p in parts]
    assert mean_label_skew(binned, deciles, 10) < 0.1


def test_label_skew_does_not_leave_a_partys_rows_ordered_by_class():
    X, y = make_data(400, n_classes=4)
    for part in partition(X, y, 4, "label:1", seed=3):
        classes = len(np.unique(part.y))
        if classes > 1:
            assert np.count_nonzero(np.diff(part.y)) > classes - 1


def test_quantity_skew_makes_sizes_unequal_while_iid_keeps_them_equal():
    X, y = make_data(2000)
    iid = coefficient_of_variation(partition(X, y, 10, "iid", seed=5))
    skewed = coefficient_of_variation(partition(X, y, 10, "quantity:0.5", seed=5))
    assert iid < 0.01
    assert skewed > 0.3


def test_feature_noise_grows_with_party_number():
    sigma, parties = 2.0, 4
    X, y = make_data(40_000, n_features=2)
    X[::10, 0] = np.nan
    parts = partition(X, y, parties, f"feature:{sigma}", seed=11)
    for number, part in enumerate(parts, start=1):
        original = X[part.indices]
        noise = part.X - original
        np.testing.assert_array_equal(np.isnan(part.X), np.isnan(original))
        noise = noise[~np.isnan(noise)]
        expected = sigma * number / parties
        assert abs(noise.std() / expected - 1) < 0.05
        assert abs(noise.mean()) < 0.05 * expected
        assert len(np.unique(noise)) == noise.size  # fresh noise for every value


def test_feature_noise_of_zero_leaves_values_unchanged_and_works_on_integers():
    X = np.arange(60).reshape(30, 2)
    parts = partition(X, None, 3, "feature:0", seed=2)
    for part in parts:
        assert part.X.dtype == np.float64
        np.testing.assert_array_equal(part.X, X[part.indices])


def test_feature_split_assigns_rows_like_iid():
    X, y = make_data(90)
    iid = partition(X, y, 3, "iid", seed=4)
    noisy = partition(X, y, 3, "feature:1", seed=4)
    for a, b in zip(iid, noisy, strict=True):
        np.testing.assert_array_equal(a.indices, b.indices)


# --- bad input ---------------------------------------------------------------------------


def test_too_few_rows_for_the_parties_is_rejected_with_the_numbers():
    X, y = make_data(40)
    with pytest.raises(InputError, match="cannot give 30 parties at least 2 rows each from 40"):
        partition(X, y, 30, "iid", min_samples=2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"parties": 0}, "parties"),
        ({"parties": 2.5}, "parties"),
        ({"parties": True}, "parties"),
        ({"min_samples": 0}, "min_samples"),
        ({"seed": -1}, "seed"),
        ({"split": "label:0"}, "label"),
        ({"split": 42}, "split"),
        ({"X": np.zeros(10)}, "2-D"),
        ({"X": np.array([["a", "b"]] * 10)}, "numeric"),
        ({"y": np.zeros(9)}, "one value per row"),
        ({"y": np.full(10, np.nan), "split": "label:1"}, "NaN"),
    ],
)
def test_bad_arguments_are_input_errors(kwargs, message):
    arguments = {"X": np.zeros((10, 2)), "y": np.zeros(10), "parties": 2, "split": "iid"}
    arguments.update(kwargs)
    with pytest.raises(InputError, match=message):
        partition(**arguments)


@pytest.mark.parametrize("split", ["label:0.05", "quantity:0.05"])
def test_short_parties_are_topped_up_and_the_rest_keeps_its_skew(split):
    """NIID-Bench would redraw forever here (40 rows, 15 parties, ≥ 2 rows each, β
    tiny): short parties get rows of the largest instead, and the split stays skewed."""
    X, y = make_data(400, n_classes=4)
    parts = partition(X, y, 15, split, seed=3, min_samples=10)
    sizes = sorted(len(p.indices) for p in parts)
    assert sizes[0] == 10 and sorted(all_indices(parts).tolist()) == list(range(400))
    if split.startswith("quantity"):
        assert sizes[-1] > 3 * 400 / 15  # one party still holds far more than its share
    else:
        assert mean_label_skew(parts, y, 4) > 0.3


def test_feature_noise_takes_a_unit_per_feature_and_spares_zero_unit_features():
    X, y = make_data(20_000, n_features=3)
    X[:, 1] = np.arange(20_000) % 2  # a categorical column
    X[:, 2] *= 1e-4
    spread = feature_spread(X, categorical=[1])
    np.testing.assert_allclose(spread, [X[:, 0].std(), 0.0, X[:, 2].std()])
    parts = partition(X, y, 2, "feature:0.5", seed=1, noise_scale=spread)
    for number, part in enumerate(parts, start=1):
        noise = part.X - X[part.indices]
        np.testing.assert_array_equal(noise[:, 1], 0.0)
        np.testing.assert_allclose(noise[:, [0, 2]].std(axis=0),
                                   spread[[0, 2]] * 0.5 * number / 2, rtol=0.05)


@pytest.mark.parametrize("scale", [np.ones(2), np.array([1.0, -1.0, 1.0]),
                                   np.array([1.0, np.nan, 0.0])])
def test_a_bad_noise_scale_is_an_input_error(scale):
    X, y = make_data(30)
    with pytest.raises(InputError, match="noise_scale"):
        partition(X, y, 3, "feature:1", noise_scale=scale)


def test_feature_spread_skips_missing_values_and_gives_constant_columns_zero():
    X = np.array([[1.0, 5.0, np.nan], [3.0, 5.0, np.nan], [np.nan, 5.0, np.nan]])
    np.testing.assert_array_equal(feature_spread(X), [1.0, 0.0, 0.0])


# --- SplitSpec ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("iid", "iid"),
        ("label:0.5", "label:0.5"),
        (" Label:1 ", "label:1"),
        ("quantity:1e-7", "quantity:1e-07"),
        ("feature:0", "feature:0"),
        ("feature:0.25", "feature:0.25"),
    ],
)
def test_split_spec_prints_canonical_text(text, canonical):
    assert str(SplitSpec.parse(text)) == canonical
    assert SplitSpec.parse(canonical) == SplitSpec.parse(text)


@given(
    kind=st.sampled_from(["label", "quantity", "feature"]),
    param=st.floats(min_value=1e-300, max_value=1e300),
)
def test_split_spec_round_trips_through_text(kind, param):
    spec = SplitSpec(kind, param)
    assert SplitSpec.parse(str(spec)) == spec


@pytest.mark.parametrize(
    "text",
    [
        "",
        "iid:1",
        "label",
        "label:",
        "label:0",
        "label:-1",
        "label:abc",
        "label:inf",
        "quantity:nan",
        "quantity:0",
        "feature:-0.1",
        "feature",
        "dirichlet:0.5",
        "label:0.5:1",
    ],
)
def test_split_spec_rejects_anything_else_and_names_the_accepted_forms(text):
    with pytest.raises(InputError, match="'label:β'"):
        SplitSpec.parse(text)


def test_split_spec_checks_hand_built_values_too():
    with pytest.raises(InputError):
        SplitSpec("label", -1.0)
    with pytest.raises(InputError):
        SplitSpec("iid", 0.5)
    with pytest.raises(InputError):
        SplitSpec("skew", 0.5)  # type: ignore[arg-type]


# --- describe ----------------------------------------------------------------------------


def test_describe_reports_sizes_and_label_counts():
    X, y = make_data(100, n_classes=3)
    parts = partition(X, y, 4, "label:0.5", seed=2)
    summary = describe(parts)
    assert summary["parties"] == 4
    assert summary["rows"] == 100
    assert summary["sizes"] == [len(p.indices) for p in parts]
    for counts, part in zip(summary["label_counts"], parts, strict=True):
        assert counts == {k: int(np.sum(part.y == k)) for k in np.unique(part.y).tolist()}


def test_describe_without_target_has_no_label_counts():
    X, _ = make_data(30)
    assert describe(partition(X, None, 3, "iid"))["label_counts"] is None
