"""From results CSVs to the paper's Table III, per-method means, training health and
the figures, as files (the counting rules are :mod:`fednorm.training.scores`').

``training_health.csv`` checks that the numbers measure normalization, not training
defects: per dataset, the share of runs that ended at the round cap, the share of
classification runs that predict a single class on the whole test set, and the
centralized references (``central_model``, ``central_linear``) beside the mean of
the federated and local runs.

Torch-free; matplotlib is imported only to draw.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fednorm.engine.errors import InputError
from fednorm.training.claims import write_claims
from fednorm.training.figures import plot_all
from fednorm.training.normalization import (
    LOOKUP_REFERENCE,
    REFERENCE_NORMALIZATIONS,
    NormalizationSpec,
)
from fednorm.training.scores import (
    IMBALANCE_TYPES,
    METRIC,
    READINGS,
    TIE_MARGIN,
    PairCounts,
    Scores,
    as_number,
    count_pairs,
    mean_scores,
    method_means,
    per_seed_scores,
    read_results,
)
from fednorm.training.tables import write_interval_tables


def write_report(paths: Sequence[Path], out_dir: Path, figures: bool = True) -> list[Path]:
    """Write Table III (by margin and by intervals), the per-method means, the training
    health and (unless ``figures`` is off) the figures; returns the files written."""
    rows = read_results(paths)
    scores = mean_scores(rows)
    if not scores.means:
        raise InputError("the results hold no finished runs to report on")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [*_write_table3({r: count_pairs(scores, r) for r in READINGS}, out_dir),
               *write_interval_tables(rows, out_dir), *write_claims(rows, out_dir),
               *_write_means(scores, out_dir), *_write_health(training_health(rows), out_dir)]
    if not figures:
        return written
    return written + plot_all(scores, out_dir, per_seed_scores(rows))


READING_NOTE = {
    "paper": "the paper's rule: R² pairs only when both means > 0",
    "all_pairs": "all pairs, R² floored at 0",
}


def _write_table3(tables: dict[str, list[PairCounts]], out_dir: Path) -> list[Path]:
    header = ["reading", "dataset", "metric", "federated", "local", "ties",
              "mean_fed_improvement"]
    csv_rows: list[list] = []
    text = ("Federated vs local normalization, one pair per dataset × clients × skew × "
            f"method (mean over seeds); tie when |diff| < {TIE_MARGIN}.\n")
    for reading, table in tables.items():
        rows = [[c.dataset, c.metric, c.federated, c.local, c.ties,
                 _fmt(c.mean_improvement)] for c in table]
        total = ["Total", "", *(sum(c[i] for c in rows) for i in (2, 3, 4)), ""]
        csv_rows += [[reading, *row] for row in [*rows, total]]
        lines = ["| Dataset | Metric | Federated | Local | Ties | Mean Fed. Impr. |",
                 "|---|---|---:|---:|---:|---:|"]
        lines += [f"| {' | '.join(str(v) for v in row)} |" for row in [*rows, total]]
        text += f"\n{READING_NOTE[reading]}:\n\n" + "\n".join(lines) + "\n"
    _write_csv(out_dir / "table3.csv", header, csv_rows)
    (out_dir / "table3.md").write_text(text, encoding="utf-8")
    return [out_dir / "table3.csv", out_dir / "table3.md"]


@dataclass
class Health:
    """One dataset's training check (see the module doc)."""

    dataset: str
    trained_runs: int = 0
    at_cap: int = 0
    classified_runs: int = 0
    one_class: int = 0
    scores: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def share(self, part: int, whole: int) -> float:
        return part / whole if whole else math.nan


HEALTH_GROUPS = ("federated", "local", *REFERENCE_NORMALIZATIONS, LOOKUP_REFERENCE)


def training_health(rows: Iterable[dict[str, str]]) -> list[Health]:
    """Per dataset: cap and single-class shares over the federated runs (references
    excluded), and mean scores of federated, local and reference runs (R² ≥ 0)."""
    table: dict[str, Health] = {}
    for row in rows:
        health = table.setdefault(row["dataset"], Health(row["dataset"]))
        spec = NormalizationSpec.parse(row["normalization"])
        group = str(spec) if spec.is_reference else spec.kind
        value = as_number(row.get(METRIC.get(row["task"], ""), ""))
        if value is not None and group in HEALTH_GROUPS:
            health.scores[group].append(max(value, 0.0) if row["task"] == "regression"
                                        else value)
        if spec.is_reference:
            continue
        rounds, cap = as_number(row.get("rounds", "")), as_number(row.get("max_rounds", ""))
        if rounds is not None and cap is not None:
            health.trained_runs += 1
            health.at_cap += rounds >= cap
        classes = as_number(row.get("test_predicted_classes", ""))
        if row["task"] == "classification" and classes is not None:
            health.classified_runs += 1
            health.one_class += classes <= 1
    return [table[name] for name in sorted(table)]


def _write_health(table: list[Health], out_dir: Path) -> list[Path]:
    """``training_health.csv`` and the same table as ``training_health.md`` (shares in
    %, scores to 3 places), which the results README quotes."""
    header = ["dataset", "runs", "share_at_round_cap", "share_single_class",
              *(f"mean_{g}" for g in HEALTH_GROUPS)]
    rows = [[h.dataset, h.trained_runs, h.share(h.at_cap, h.trained_runs),
             h.share(h.one_class, h.classified_runs),
             *(sum(v) / len(v) if (v := h.scores.get(g)) else math.nan for g in HEALTH_GROUPS)]
            for h in table]
    path = out_dir / "training_health.csv"
    _write_csv(path, header, [[*row[:2], *map(_fmt, row[2:])] for row in rows])
    names = ["dataset", "runs", "at the round cap", "predicting one class",
             *(g.removeprefix("central_") for g in HEALTH_GROUPS)]
    lines = ["| " + " | ".join(names) + " |", "|---|" + "---:|" * (len(names) - 1)]
    lines += [f"| {row[0]} | {row[1]} | {_percent(row[2])} | {_percent(row[3])} | "
              + " | ".join(_fmt(v, 3) for v in row[4:]) + " |" for row in rows]
    markdown = out_dir / "training_health.md"
    markdown.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [path, markdown]


def _percent(share: float) -> str:
    return "—" if not math.isfinite(share) else f"{100 * share:.1f} %"


def _write_means(scores: Scores, out_dir: Path) -> list[Path]:
    header = ["metric", "normalization", *IMBALANCE_TYPES, "all"]
    rows = []
    for metric in sorted(set(METRIC.values()) & {scores.metric(d) for d in scores.tasks}):
        for norm, by_kind in method_means(scores, metric).items():
            rows.append([metric, norm, *(_fmt(by_kind.get(k, math.nan))
                                         for k in (*IMBALANCE_TYPES, "all"))])
    _write_csv(out_dir / "method_means.csv", header, rows)
    return [out_dir / "method_means.csv"]


def _fmt(value: float, places: int = 4) -> str:
    return "" if not math.isfinite(value) else f"{value:.{places}f}"


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with path.open("w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
