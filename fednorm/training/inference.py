"""Is a federated − local difference larger than the noise between runs?

Table III's margin reading (:mod:`fednorm.training.scores`) compares seed *means*
against a fixed 0.005, while re-running one partition moves a score by more than that.
Here every (dataset, clients, skew, privacy, method) cell gets the per-seed differences
``federated_<m> − local_<m>``, **paired** on the seed (both runs share the seed's
partition and splits), and two readings of them:

* a percentile **bootstrap 95 % interval** of the mean difference (resampling the
  pairs), and the verdict it gives: a federated win where the interval lies above 0, a
  local win where it lies below, *undecided* otherwise (and with fewer than
  :data:`MIN_PAIRS` pairs, which say nothing about spread);
* the exact two-sided **Wilcoxon signed-rank** p-value (zero differences dropped,
  tied magnitudes given their mean rank). With n pairs no p-value can fall below
  2 / 2ⁿ: 0.25 for 3 seeds, 0.0625 for 5.

R² scores are floored at 0 before differencing, as in the all-pairs reading: one
diverged run (R² ≈ −1e7) would otherwise decide a cell alone. Torch-free.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from fednorm.protocols import METHODS
from fednorm.training.scores import as_number

LEVEL = 0.95
RESAMPLES = 10_000
MIN_PAIRS = 2  # one pair has no spread: its "interval" would be a point
EXACT_LIMIT = 24  # exact signed-rank distribution up to this many non-zero differences

Verdict = Literal["federated", "local", "undecided"]
CellMethod = tuple[str, str, str, str, str]  # dataset, clients, skew, privacy, method


@dataclass(frozen=True)
class PairedDifference:
    """One cell's federated − local differences, one per seed, and what they support."""

    cell: CellMethod
    metric: str
    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    low: float
    high: float
    p_value: float

    @property
    def mean(self) -> float:
        return float(np.mean(self.differences))

    @property
    def verdict(self) -> Verdict:
        return CELL_VERDICT[side_of_zero(self.low, self.high)]


CELL_VERDICT: dict[int, Verdict] = {1: "federated", -1: "local", 0: "undecided"}


def side_of_zero(low: float, high: float) -> int:
    """1 where the interval lies above 0, -1 where below, 0 across it (or undefined)."""
    return 1 if low > 0 else -1 if high < 0 else 0


@dataclass
class IntervalCounts:
    """One dataset's row of Table III by intervals: cells the interval decides."""

    dataset: str
    metric: str
    federated: int = 0
    local: int = 0
    undecided: int = 0
    seeds: set[int] = field(default_factory=set)
    significant: int = 0  # cells whose signed-rank p < 0.05


def bootstrap_interval(differences: Sequence[float], level: float = LEVEL,
                       resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``differences`` (NaN, NaN with fewer
    than :data:`MIN_PAIRS`). Seeded, so a report is reproducible."""
    if len(differences) < MIN_PAIRS:
        return math.nan, math.nan
    return stratified_interval([differences], level, resamples, seed)


def stratified_interval(groups: Sequence[Sequence[float]], level: float = LEVEL,
                        resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of the groups' means, each group
    resampled within itself (a group of one value adds no spread). Seeded."""
    if not groups:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    total = np.zeros(resamples)
    for group in groups:
        values = np.asarray(group, dtype=np.float64)
        total += values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(
            axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(total / len(groups), [tail, 1 - tail])
    return float(low), float(high)


def signed_rank_p(differences: Sequence[float]) -> float:
    """Two-sided p-value of Wilcoxon's signed-rank test that the differences are
    symmetric about 0: exact up to :data:`EXACT_LIMIT` non-zero differences (every sign
    pattern counted), the normal approximation beyond. 1.0 when all are zero."""
    values = np.asarray([d for d in differences if d != 0], dtype=np.float64)
    n = len(values)
    if n == 0:
        return 1.0
    ranks = _mean_ranks(np.abs(values))
    positive = float(ranks[values > 0].sum())
    if n > EXACT_LIMIT:
        return _normal_p(positive, ranks)
    doubled = np.rint(2 * ranks).astype(np.int64)  # mean ranks are multiples of 1/2
    counts = _sign_pattern_counts(doubled)
    statistic = round(2 * positive)
    total = counts.sum()
    lower, upper = counts[: statistic + 1].sum() / total, counts[statistic:].sum() / total
    return float(min(1.0, 2 * min(lower, upper)))


def _mean_ranks(magnitudes: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``magnitudes``, tied values sharing the mean of their ranks."""
    order = np.argsort(magnitudes, kind="stable")
    ranks = np.empty(len(magnitudes))
    ranks[order] = np.arange(1, len(magnitudes) + 1)
    for value in np.unique(magnitudes):
        tied = magnitudes == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def _sign_pattern_counts(doubled_ranks: np.ndarray) -> np.ndarray:
    """counts[s]: how many of the 2ⁿ sign patterns give a doubled positive-rank sum s."""
    counts = np.zeros(int(doubled_ranks.sum()) + 1, dtype=np.int64)
    counts[0] = 1
    for rank in doubled_ranks:
        shifted = np.zeros_like(counts)
        shifted[rank:] = counts[: len(counts) - rank]
        counts = counts + shifted
    return counts


def _normal_p(positive: float, ranks: np.ndarray) -> float:
    mean = ranks.sum() / 2
    sd = math.sqrt(float((ranks**2).sum()) / 4)
    z = (positive - mean) / sd
    return float(math.erfc(abs(z) / math.sqrt(2)))


def paired_differences(rows: Iterable[dict[str, str]], metric_of: dict[str, str]
                       ) -> list[PairedDifference]:
    """Every cell's per-seed federated − local differences with interval and p-value.

    ``metric_of`` maps a task to the score column read (rows whose task it lacks, or
    whose score is missing, are skipped); a seed counts only where both runs scored.
    """
    scores: dict[tuple[CellMethod, str], dict[int, float]] = defaultdict(dict)
    metrics: dict[str, str] = {}
    for row in rows:
        metric = metric_of.get(row["task"])
        value = as_number(row.get(metric or "", ""))
        side, _, method = row["normalization"].partition("_")
        if value is None or metric is None or side not in ("federated", "local") \
                or method not in METHODS:
            continue
        cell = (row["dataset"], row["clients"], row["skew"], row.get("privacy") or "plain",
                method)
        metrics[row["dataset"]] = metric
        floor = 0.0 if metric == "test_r2" else -math.inf
        scores[cell, side][int(row["seed"])] = max(value, floor)
    cells = sorted({cell for cell, _ in scores})
    return [_difference(cell, metrics[cell[0]], scores[cell, "federated"],
                        scores[cell, "local"]) for cell in cells
            if set(scores.get((cell, "federated"), ())) & set(scores.get((cell, "local"), ()))]


def _difference(cell: CellMethod, metric: str, federated: dict[int, float],
                local: dict[int, float]) -> PairedDifference:
    seeds = tuple(sorted(set(federated) & set(local)))
    differences = tuple(federated[s] - local[s] for s in seeds)
    low, high = bootstrap_interval(differences)
    return PairedDifference(cell, metric, seeds, differences, low, high,
                            signed_rank_p(differences))


def count_intervals(differences: Iterable[PairedDifference]) -> list[IntervalCounts]:
    """Table III by intervals: per dataset, the cells whose interval excludes 0 on
    either side, and the undecided rest."""
    table: dict[str, IntervalCounts] = {}
    for difference in differences:
        dataset = difference.cell[0]
        counts = table.setdefault(dataset, IntervalCounts(dataset, difference.metric))
        setattr(counts, difference.verdict, getattr(counts, difference.verdict) + 1)
        counts.seeds.update(difference.seeds)
        counts.significant += difference.p_value < 0.05
    return [table[name] for name in sorted(table)]
