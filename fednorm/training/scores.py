"""Scores of the study's runs, and the paper's Table III counts over them.

Scores are test F1 for classification and test R² for regression, as in the paper.
A *cell* is one dataset × client count × skew (× privacy) setting; a normalization's
score in a cell is its mean over seeds. Table III compares, cell by cell and method by
method, ``federated_<m>`` with ``local_<m>``:

* a pair is a tie when |fed − local| < 0.005, else a win for the higher one;
* "mean fed. improvement" is the mean of fed − local over the pairs federated wins;
* two readings for regression: the **paper's rule** counts only pairs whose two R²
  means are both > 0 (a negative R² is a model worse than the mean, not a score);
  **all pairs** counts every pair with each R² floored at 0, so a pair where local
  normalization fails (R² ≤ 0) and federated does not is a federated win, and a pair
  where both fail is a tie. Classification pairs are the same in both readings.

The per-method means (and the figures) count, as the all-pairs reading does, an R²
below 0 as 0: one diverged run (a local Yeo-Johnson fitted on a handful of rows can
send a test row to R² ≈ −1e7) would otherwise swamp every other cell's mean. The CSVs
keep raw values.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fednorm.engine.errors import InputError
from fednorm.protocols import METHODS
from fednorm.sim.partition import SplitSpec
from fednorm.training.grid import COLUMNS
from fednorm.training.normalization import (
    PAPER_NORMALIZATIONS,
    REFERENCE_NORMALIZATIONS,
)

TIE_MARGIN = 0.005
IMBALANCE_TYPES = ("iid", "quantity", "label", "feature")
METRIC = {"classification": "test_f1", "regression": "test_r2"}  # the paper's reading
# The main reading: macro-F1 (support-weighted F1 gives HCV's majority predictor 0.81).
MAIN_METRIC = {"classification": "test_macro_f1", "regression": "test_r2"}
METRIC_LABEL = {"test_f1": "test F1", "test_r2": "test R²", "test_macro_f1": "test macro-F1"}
READINGS = ("paper", "all_pairs")  # see the module doc

CellKey = tuple[str, str, str, str]  # dataset, clients, skew, privacy


@dataclass
class Scores:
    """Mean score over seeds of every (cell, normalization), with each dataset's task."""

    means: dict[CellKey, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    tasks: dict[str, str] = field(default_factory=dict)
    metric_of: dict[str, str] = field(default_factory=lambda: METRIC)

    def metric(self, dataset: str) -> str:
        return self.metric_of[self.tasks[dataset]]


@dataclass
class PairCounts:
    """One dataset's row of Table III."""

    dataset: str
    metric: str
    reading: str = "paper"
    federated: int = 0
    local: int = 0
    ties: int = 0
    improvements: list[float] = field(default_factory=list)

    @property
    def mean_improvement(self) -> float:
        return sum(self.improvements) / len(self.improvements) if self.improvements else math.nan


def read_results(paths: Sequence[Path]) -> list[dict[str, str]]:
    """The finished (status ok) rows of one or more results files."""
    rows: list[dict[str, str]] = []
    for path in paths:
        if not Path(path).is_file():
            raise InputError(f"no results file at {path}")
        with Path(path).open(newline="", encoding="utf-8") as stream:
            reader = csv.DictReader(stream)
            missing = {"dataset", "skew", "clients", "normalization", "seed", "task"} - set(
                reader.fieldnames or ())
            if missing or not set(METRIC.values()) <= set(reader.fieldnames or ()):
                raise InputError(f"{path} is not a fednorm results file (columns: "
                                 f"{', '.join(COLUMNS[:6])}, task, test_f1, test_r2, ...)")
            rows += [row for row in reader if row.get("status", "ok") == "ok"]
    return rows


def mean_scores(rows: Iterable[dict[str, str]], metric_of: dict[str, str] = METRIC
                ) -> Scores:
    """Average each (cell, normalization)'s score (column ``metric_of[task]``) over its
    seeds; NaN and missing scores are skipped."""
    sums: dict[tuple[CellKey, str], list[float]] = defaultdict(list)
    scores = Scores(metric_of=metric_of)
    for row in rows:
        task = row["task"]
        scores.tasks[row["dataset"]] = task
        value = as_number(row.get(metric_of.get(task, ""), ""))
        if value is not None:
            key = (row["dataset"], row["clients"], row["skew"], row.get("privacy") or "plain")
            sums[key, row["normalization"]].append(value)
    for (cell, normalization), values in sums.items():
        scores.means[cell][normalization] = sum(values) / len(values)
    return scores


def count_pairs(scores: Scores, reading: str = "paper") -> list[PairCounts]:
    """Table III: per dataset, how often federated beats local, loses, or ties, by the
    paper's rule or over all pairs (see the module doc)."""
    if reading not in READINGS:
        raise InputError(f"unknown reading {reading!r}; use {', '.join(READINGS)}")
    table: dict[str, PairCounts] = {}
    for cell, by_norm in sorted(scores.means.items()):
        dataset = cell[0]
        counts = table.setdefault(dataset, PairCounts(dataset, scores.metric(dataset),
                                                      reading))
        for method in METHODS:
            fed, local = by_norm.get(f"federated_{method}"), by_norm.get(f"local_{method}")
            if fed is None or local is None:
                continue
            if counts.metric == "test_r2":
                if reading == "paper" and not (fed > 0 and local > 0):
                    continue
                fed, local = max(fed, 0.0), max(local, 0.0)
            diff = fed - local
            if abs(diff) < TIE_MARGIN:
                counts.ties += 1
            elif diff > 0:
                counts.federated += 1
                counts.improvements.append(diff)
            else:
                counts.local += 1
    return list(table.values())


def method_means(scores: Scores, metric: str, datasets: set[str] | None = None
                 ) -> dict[str, dict[str, float]]:
    """Mean score per normalization and imbalance type (plus ``all``) over datasets scored
    by ``metric`` (only ``datasets``, if given), every cell counting once (an R² below 0
    as 0)."""
    floor = 0.0 if metric == "test_r2" else -math.inf
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for cell, by_norm in scores.means.items():
        if scores.metric(cell[0]) != metric or (datasets is not None
                                                and cell[0] not in datasets):
            continue
        kind = SplitSpec.parse(cell[2]).kind
        for normalization, value in by_norm.items():
            for group in (kind, "all"):
                values[normalization][group].append(max(value, floor))
    return {
        norm: {kind: sum(v) / len(v) for kind, v in by_kind.items()}
        for norm, by_kind in sorted(values.items(), key=lambda item: norm_order(item[0]))
    }


def per_seed_scores(rows: Sequence[dict[str, str]], metric_of: dict[str, str] = METRIC
                    ) -> list[Scores]:
    """:func:`mean_scores` of each seed's rows alone (in seed order): what a figure's
    bar would be had only that seed run, so a bar can show its seed-to-seed range."""
    seeds = sorted({row["seed"] for row in rows}, key=int)
    return [mean_scores([r for r in rows if r["seed"] == seed], metric_of) for seed in seeds]


def datasets_of(scores: Scores, metric: str, datasets: set[str] | None = None
                ) -> dict[str, set[str]]:
    """Per normalization, the datasets scored by ``metric`` (among ``datasets``, if
    given) that have runs of it."""
    found: dict[str, set[str]] = defaultdict(set)
    for cell, by_norm in scores.means.items():
        if scores.metric(cell[0]) == metric and (datasets is None or cell[0] in datasets):
            for normalization in by_norm:
                found[normalization].add(cell[0])
    return dict(found)


def norm_order(name: str) -> tuple[int, str]:
    order = [*PAPER_NORMALIZATIONS, *REFERENCE_NORMALIZATIONS]
    return (order.index(name), name) if name in order else (len(order), name)


def as_number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None

