"""Tests of the per-cell inference: paired bootstrap intervals, the signed-rank test and
Table III counted by intervals."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fednorm.training.claims import dataset_claims, write_claims
from fednorm.training.inference import (
    bootstrap_interval,
    count_intervals,
    paired_differences,
    signed_rank_p,
    stratified_interval,
)


def test_a_constant_positive_difference_has_an_interval_above_zero():
    low, high = bootstrap_interval([0.02] * 5)
    assert low == pytest.approx(0.02) and high == pytest.approx(0.02)


def test_symmetric_noise_has_an_interval_around_zero():
    low, high = bootstrap_interval([-0.03, 0.03, -0.01, 0.01, 0.0, -0.02, 0.02])
    assert low < 0 < high


def test_a_single_pair_has_no_interval():
    assert all(np.isnan(bootstrap_interval([0.5])))


def test_the_interval_of_two_values_spans_their_mean_resamples():
    # Resampling two values gives means a, (a+b)/2 and b with chances 1/4, 1/2, 1/4, so
    # the 2.5 % and 97.5 % quantiles are a and b.
    assert bootstrap_interval([0.0, 1.0]) == pytest.approx((0.0, 1.0))


def test_signed_rank_p_of_hand_counted_cases():
    # n = 3, all positive: only 1 of the 8 sign patterns is as extreme on each side.
    assert signed_rank_p([0.1, 0.2, 0.3]) == pytest.approx(2 / 8)
    assert signed_rank_p([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx(2 / 32)
    # n = 3, ranks 1 and 2 positive, 3 negative: T+ = 3; T+ ≤ 3 in 5 of 8 patterns
    # ({}, {1}, {2}, {3}, {1,2}), T+ ≥ 3 in 5 of 8: p = min(1, 2 · 5/8) = 1.
    assert signed_rank_p([0.1, 0.2, -0.3]) == 1.0
    assert signed_rank_p([0.0, 0.0]) == 1.0  # zeros dropped: nothing to test


def brute_force_p(differences: list[float]) -> float:
    """Every sign pattern of the ranks, as the definition says (ties: mean ranks)."""
    values = [d for d in differences if d != 0]
    magnitudes = sorted(abs(v) for v in values)
    rank = {m: np.mean([i + 1 for i, x in enumerate(magnitudes) if x == m])
            for m in magnitudes}
    ranks = [rank[abs(v)] for v in values]
    observed = sum(r for r, v in zip(ranks, values, strict=True) if v > 0)
    sums = [sum(r for r, s in zip(ranks, signs, strict=True) if s)
            for signs in itertools.product((0, 1), repeat=len(ranks))]
    lower = np.mean([s <= observed + 1e-9 for s in sums])
    upper = np.mean([s >= observed - 1e-9 for s in sums])
    return min(1.0, 2 * min(lower, upper))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([-3, -2, -1, 0, 1, 2, 3, 4]), min_size=1, max_size=9))
def test_signed_rank_p_equals_counting_every_sign_pattern(values):
    assert signed_rank_p([v / 100 for v in values]) == pytest.approx(
        brute_force_p([v / 100 for v in values]))


@pytest.mark.parametrize("values", [[0.3, -0.1, 0.25, 0.4, 0.05, 0.12],
                                    [0.01, 0.02, 0.03, -0.04, 0.05, 0.06, 0.07, 0.08],
                                    [-0.2, -0.5, 0.1, -0.35, -0.05]])
def test_signed_rank_p_equals_scipys_exact_test(values):
    stats = pytest.importorskip("scipy.stats")
    assert signed_rank_p(values) == pytest.approx(
        stats.wilcoxon(values, method="exact").pvalue)


def test_signed_rank_p_beyond_the_exact_limit_is_the_normal_approximation():
    stats = pytest.importorskip("scipy.stats")
    values = list(np.random.default_rng(3).normal(0.01, 0.02, 40))
    assert signed_rank_p(values) == pytest.approx(
        stats.wilcoxon(values, method="approx", correction=False).pvalue)


def run_row(normalization: str, seed: int, value: float, skew: str = "iid",
            dataset: str = "cls", task: str = "classification") -> dict[str, str]:
    metric = "test_f1" if task == "classification" else "test_r2"
    return {"dataset": dataset, "clients": "10", "skew": skew, "privacy": "plain",
            "normalization": normalization, "seed": str(seed), "task": task,
            metric: str(value)}


def test_differences_are_paired_on_the_seed_and_counted_only_where_the_interval_decides():
    rows = []
    for seed in range(5):
        # zscore: federated ahead by 0.05 on every seed -> a federated win.
        rows += [run_row("federated_zscore", seed, 0.80 + seed / 100),
                 run_row("local_zscore", seed, 0.75 + seed / 100)]
        # minmax: the sign alternates -> undecided, though the means differ by 0.006, a
        # federated win by the 0.005 margin.
        rows += [run_row("federated_minmax", seed, 0.80 + (0.06 if seed % 2 else -0.03)),
                 run_row("local_minmax", seed, 0.80)]
        # robust: local ahead on every seed -> a local win.
        rows += [run_row("federated_robust", seed, 0.6, skew="label:0.5"),
                 run_row("local_robust", seed, 0.7 + seed / 50, skew="label:0.5")]
    rows.append(run_row("local_yeojohnson", 0, 0.5))  # no federated partner: no cell
    rows.append(run_row("federated_zscore", 9, 0.1))  # no local run on seed 9: unpaired
    differences = {d.cell[4]: d for d in paired_differences(rows, {"classification":
                                                                   "test_f1"})}
    assert set(differences) == {"zscore", "minmax", "robust"}
    zscore = differences["zscore"]
    assert zscore.seeds == (0, 1, 2, 3, 4)
    assert zscore.differences == pytest.approx((0.05,) * 5)
    assert (zscore.verdict, zscore.p_value) == ("federated", pytest.approx(2 / 32))
    assert differences["minmax"].mean == pytest.approx(0.006)
    assert differences["minmax"].verdict == "undecided"
    assert differences["robust"].verdict == "local"
    (counts,) = count_intervals(differences.values())
    assert (counts.federated, counts.local, counts.undecided) == (1, 1, 1)
    assert counts.seeds == {0, 1, 2, 3, 4} and counts.significant == 0  # p ≥ 1/16


def test_r2_is_floored_at_zero_before_differencing():
    rows = []
    for seed in range(3):
        rows += [run_row("federated_zscore", seed, 0.5, task="regression", dataset="reg"),
                 run_row("local_zscore", seed, -1e7, task="regression", dataset="reg")]
    (difference,) = paired_differences(rows, {"regression": "test_r2"})
    assert difference.differences == pytest.approx((0.5,) * 3)


def test_rows_of_a_task_without_a_metric_are_skipped():
    rows = [run_row("federated_zscore", 0, 0.9), run_row("local_zscore", 0, 0.8)]
    assert paired_differences(rows, {"regression": "test_r2"}) == []


# --- per-dataset claims ------------------------------------------------------------------


def test_the_stratified_interval_resamples_each_group_within_itself():
    # Groups [0, 1] and [2]: the first's resampled mean is 0, 1/2 or 1 (chances 1/4, 1/2,
    # 1/4), the second's always 2, so the mean of the two is 1, 1.25 or 1.5 and the 95 %
    # interval is (1, 1.5). Pooling the three values, or weighting groups by size, would
    # reach below 1.
    assert stratified_interval([[0.0, 1.0], [2.0]]) == pytest.approx((1.0, 1.5))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.floats(-1, 1), min_size=1, max_size=6), min_size=1, max_size=5))
def test_the_stratified_interval_lies_within_the_groups_ranges(groups):
    low, high = stratified_interval(groups)
    mean = np.mean([np.mean(g) for g in groups])
    lows, highs = [min(g) for g in groups], [max(g) for g in groups]
    assert np.mean(lows) - 1e-12 <= low <= high <= np.mean(highs) + 1e-12
    if all(len(set(g)) == 1 for g in groups):  # no spread anywhere: the interval is a point
        assert low == pytest.approx(mean) and high == pytest.approx(mean)


def test_a_dataset_claim_holds_is_reversed_or_is_not_shown_by_its_interval(tmp_path):
    rows = []
    for seed, (skew, noise) in itertools.product(range(5), [("iid", 0.0), ("label:0.5", 0.01)]):
        rows += [run_row("federated_zscore", seed, 0.8 + noise * seed, skew, "up"),
                 run_row("local_zscore", seed, 0.7, skew, "up"),
                 run_row("federated_zscore", seed, 0.6, skew, "down"),
                 run_row("local_zscore", seed, 0.7 + noise * seed, skew, "down"),
                 run_row("federated_zscore", seed, 0.7 + (0.1 if seed % 2 else -0.1), skew,
                         "bcw"),
                 run_row("local_zscore", seed, 0.7, skew, "bcw")]
    claims = {c.dataset: c for c in dataset_claims(paired_differences(rows, METRIC_F1))}
    assert {name: c.verdict for name, c in claims.items()} == {
        "up": "holds", "down": "reversed", "bcw": "not shown"}
    # "up": cells iid (+0.1 on every seed) and label:0.5 (+0.1 + 0.01·seed): mean of means.
    assert claims["up"].effect == pytest.approx((0.1 + 0.1 + 0.02) / 2)
    assert (claims["up"].cells, claims["up"].seeds) == (2, 5)
    write_claims(rows, tmp_path)
    text = (tmp_path / "claims.md").read_text(encoding="utf-8")
    assert "| up | test_f1 | 2 | 5 | +0.1100 [" in text
    assert "| bcw | test_f1 | 2 | 5 | " in text and "| 71 / 4 / 9 | 0.0414 |" in text


METRIC_F1 = {"classification": "test_f1"}
