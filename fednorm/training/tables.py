"""Table III by intervals, with the margin reading and the references beside it.

For each score reading (the **main** one: macro-F1 for classification, R² for
regression; the **paper's**: support-weighted or binary F1, R²) and each dataset:
the cells whose paired bootstrap interval lies above 0 (federated wins), below 0
(local wins) or across it (undecided), how many have a signed-rank p < 0.05, the
0.005-margin counts on the same scores, and the mean score of the majority-class,
lookup, linear and central-model references on the same partitions. Written as
``table3_intervals.md`` (what ``results/README.md`` quotes) and, cell by cell,
``table3_intervals.csv``. Torch-free.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

from fednorm.training.inference import (
    IntervalCounts,
    PairedDifference,
    count_intervals,
    paired_differences,
)
from fednorm.training.normalization import LOOKUP_REFERENCE, REFERENCE_NORMALIZATIONS
from fednorm.training.scores import MAIN_METRIC, METRIC, count_pairs, mean_scores

SCORE_READINGS = {"main": MAIN_METRIC, "paper": METRIC}
REFERENCES = ("central_majority", LOOKUP_REFERENCE,
              *(r for r in REFERENCE_NORMALIZATIONS if r != "central_majority"))
CELL_HEADER = ["reading", "dataset", "clients", "skew", "privacy", "method", "metric", "seeds",
               "mean_difference", "low", "high", "p_value", "verdict"]


def write_interval_tables(rows: Sequence[dict[str, str]], out_dir: Path) -> list[Path]:
    """``table3_intervals.md`` and ``.csv`` for both score readings."""
    text = ("Federated − local per dataset × clients × skew × method, paired on the seed: "
            "a win where the paired bootstrap 95 % interval of the mean difference "
            "excludes 0 (undecided otherwise, and with one seed); p < 0.05: Wilcoxon "
            "signed-rank, which cannot fall below 2 / 2ⁿ with n seeds (0.25 at 3, 0.0625 "
            "at 5), so this column counts nothing below 6 seeds; margin: the paper's "
            "0.005 margin on seed means (federated / local / ties); seeds: how many the "
            "dataset's rows hold. References: mean score over the same partitions. R² "
            "below 0 counts as 0.\n")
    cell_rows: list[list[object]] = []
    for reading, metric_of in SCORE_READINGS.items():
        differences = paired_differences(rows, metric_of)
        text += f"\n{reading} reading ({_metric_names(metric_of)}):\n\n"
        text += _markdown(count_intervals(differences), rows, metric_of)
        cell_rows += [_cell_row(reading, d) for d in differences]
    md, table = out_dir / "table3_intervals.md", out_dir / "table3_intervals.csv"
    md.write_text(text, encoding="utf-8")
    with table.open("w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(CELL_HEADER)
        writer.writerows(cell_rows)
    return [md, table]


def _metric_names(metric_of: dict[str, str]) -> str:
    return ", ".join(f"{task} {metric}" for task, metric in metric_of.items())


def _markdown(counts: list[IntervalCounts], rows: Sequence[dict[str, str]],
              metric_of: dict[str, str]) -> str:
    scores = mean_scores(rows, metric_of)
    margin = {c.dataset: c for c in count_pairs(scores, "all_pairs")}
    lines = ["| Dataset | Metric | Seeds | Federated | Local | Undecided | p < 0.05 "
             "| Margin F / L / T | " + " | ".join(_short(r) for r in REFERENCES) + " |",
             "|---|---|---:|---:|---:|---:|---:|---|" + "---:|" * len(REFERENCES)]
    for row in counts:
        m = margin.get(row.dataset)
        beside = f"{m.federated} / {m.local} / {m.ties}" if m else ""
        references = [_fmt(reference_mean(scores.means, row.dataset, r)) for r in REFERENCES]
        lines.append(f"| {row.dataset} | {row.metric} | {len(row.seeds)} | {row.federated} "
                     f"| {row.local} | {row.undecided} | {row.significant} | {beside} | "
                     + " | ".join(references) + " |")
    if not counts:
        lines.append("| (no paired runs with this metric) |" + " |" * (7 + len(REFERENCES)))
    return "\n".join(lines) + "\n"


def reference_mean(means: dict, dataset: str, reference: str) -> float:
    """Mean of a reference's seed means over a dataset's cells (R² floored at 0)."""
    values = [max(by_norm[reference], 0.0) for cell, by_norm in means.items()
              if cell[0] == dataset and reference in by_norm]
    return sum(values) / len(values) if values else math.nan


def _short(reference: str) -> str:
    return reference.removeprefix("central_")


def _cell_row(reading: str, d: PairedDifference) -> list[object]:
    return [reading, *d.cell[:4], d.cell[4], d.metric, " ".join(map(str, d.seeds)),
            _fmt(d.mean), _fmt(d.low), _fmt(d.high), _fmt(d.p_value), d.verdict]


def _fmt(value: float) -> str:
    return "" if not math.isfinite(value) else f"{value:.4f}"
