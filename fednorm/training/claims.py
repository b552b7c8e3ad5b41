"""Per dataset, the claim "federated normalization beats local normalization", with the
interval that supports it or does not, beside the paper's Table III.

A dataset's effect is the mean, over its cells (clients × skew × method), of each
cell's mean per-seed federated − local difference. Its 95 % interval is a stratified
paired bootstrap: every resample redraws each cell's seeds (a seed names the partition
and the splits, so this resamples partitions) and averages the cells, so the interval is
the spread that re-running the grid with other seeds would show for these cells. The
claim **holds** where the interval lies above 0, is **reversed** where it lies below, and
is **not shown** otherwise. Beside it, the cells each side wins by their own interval
(:mod:`fednorm.training.inference`) and, on the paper's score reading, the paper's
counts. Written as ``claims.md``, which the READMEs quote. Torch-free.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fednorm.training.inference import (
    PairedDifference,
    count_intervals,
    paired_differences,
    side_of_zero,
    stratified_interval,
)
from fednorm.training.scores import MAIN_METRIC, METRIC, count_pairs, mean_scores

# The paper's Table III (its Hepatitis is HCV): federated / local / ties, mean federated
# improvement (test F1; test R² for Parkinson's).
PAPER_TABLE_III: dict[str, tuple[int, int, int, float]] = {
    "bcw": (71, 4, 9, 0.0414),
    "cifar10": (16, 15, 32, 0.0113),
    "hcv": (33, 21, 30, 0.0567),
    "mnist": (45, 2, 16, 0.0817),
    "parkinsons": (67, 17, 0, 0.0645),
}


@dataclass(frozen=True)
class DatasetClaim:
    """One dataset's federated − local effect over all its cells, and what it supports."""

    dataset: str
    metric: str
    cells: int
    seeds: int
    effect: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        return {1: "holds", -1: "reversed", 0: "not shown"}[side_of_zero(self.low, self.high)]


def dataset_claims(differences: Sequence[PairedDifference]) -> list[DatasetClaim]:
    """Each dataset's effect and stratified interval over the cells ``differences`` hold."""
    by_dataset: dict[str, list[PairedDifference]] = defaultdict(list)
    for difference in differences:
        by_dataset[difference.cell[0]].append(difference)
    claims = []
    for dataset, cells in sorted(by_dataset.items()):
        low, high = stratified_interval([c.differences for c in cells])
        claims.append(DatasetClaim(
            dataset, cells[0].metric, len(cells), len({s for c in cells for s in c.seeds}),
            sum(c.mean for c in cells) / len(cells), low, high))
    return claims


def write_claims(rows: Sequence[dict[str, str]], out_dir: Path) -> list[Path]:
    """``claims.md``: the main reading's claims, then the paper's reading beside the
    paper's counts."""
    text = ("Federated − local, per dataset: the mean over its cells (clients × skew × "
            "method) of the per-seed differences, with a stratified paired bootstrap 95 % "
            "interval (each cell's seeds redrawn); the claim \"federated beats local\" "
            "holds where the interval lies above 0. Cells: how many each side wins by "
            "its own interval (federated / local / undecided); margin: the paper's rule (0.005 "
            "on seed means, R² pairs only when both > 0), as the paper counted. R² below 0 "
            "counts as 0 in the effect.\n")
    for reading, metric_of in (("main", MAIN_METRIC), ("paper", METRIC)):
        differences = paired_differences(rows, metric_of)
        counts = {c.dataset: c for c in count_intervals(differences)}
        paper = reading == "paper"
        margin = {c.dataset: c for c in count_pairs(mean_scores(rows, metric_of), "paper")
                  } if paper else {}
        lines = ["| Dataset | Metric | Cells | Seeds | Federated − local [95 % interval] "
                 "| Claim | Cells F / L / U |" + (" Margin F / L / T | Paper F / L / T "
                                                  "| Paper mean impr. |" if paper else ""),
                 "|---|---|---:|---:|---|---|---|" + ("---|---|---:|" if paper else "")]
        for claim in dataset_claims(differences):
            c = counts[claim.dataset]
            line = (f"| {claim.dataset} | {claim.metric} | {claim.cells} | {claim.seeds} | "
                    f"{claim.effect:+.4f} [{_fmt(claim.low)}, {_fmt(claim.high)}] | "
                    f"{claim.verdict} | {c.federated} / {c.local} / {c.undecided} |")
            if paper:
                m = margin[claim.dataset]
                line += f" {m.federated} / {m.local} / {m.ties} |" + _paper_columns(
                    claim.dataset)
            lines.append(line)
        text += f"\n{reading} reading:\n\n" + "\n".join(lines) + "\n"
    path = out_dir / "claims.md"
    path.write_text(text, encoding="utf-8")
    return [path]


def _paper_columns(dataset: str) -> str:
    if dataset not in PAPER_TABLE_III:
        return " — | — |"
    federated, local, ties, improvement = PAPER_TABLE_III[dataset]
    return f" {federated} / {local} / {ties} | {improvement:.4f} |"


def _fmt(value: float) -> str:
    return "—" if not math.isfinite(value) else f"{value:+.4f}"
