"""From results CSVs to the paper's Table III, per-method means, and Fig. 2/3-style plots.

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
from typing import Any

from fednorm.engine.errors import InputError
from fednorm.protocols import METHODS
from fednorm.sim.partition import SplitSpec
from fednorm.training.grid import COLUMNS
from fednorm.training.normalization import (
    PAPER_NORMALIZATIONS,
    REFERENCE_NORMALIZATIONS,
    NormalizationSpec,
)

TIE_MARGIN = 0.005
IMBALANCE_TYPES = ("iid", "quantity", "label", "feature")
METRIC = {"classification": "test_f1", "regression": "test_r2"}
METRIC_LABEL = {"test_f1": "test F1", "test_r2": "test R²"}
READINGS = ("paper", "all_pairs")  # see the module doc

CellKey = tuple[str, str, str, str]  # dataset, clients, skew, privacy


@dataclass
class Scores:
    """Mean score over seeds of every (cell, normalization), with each dataset's task."""

    means: dict[CellKey, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    tasks: dict[str, str] = field(default_factory=dict)

    def metric(self, dataset: str) -> str:
        return METRIC[self.tasks[dataset]]


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


def mean_scores(rows: Iterable[dict[str, str]]) -> Scores:
    """Average each (cell, normalization)'s score over its seeds; NaN scores are skipped."""
    sums: dict[tuple[CellKey, str], list[float]] = defaultdict(list)
    scores = Scores()
    for row in rows:
        task = row["task"]
        scores.tasks[row["dataset"]] = task
        value = _number(row.get(METRIC.get(task, ""), ""))
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


def method_means(scores: Scores, metric: str) -> dict[str, dict[str, float]]:
    """Mean score per normalization and imbalance type (plus ``all``) over datasets scored
    by ``metric``, every cell counting once (an R² below 0 as 0)."""
    floor = 0.0 if metric == "test_r2" else -math.inf
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for cell, by_norm in scores.means.items():
        if scores.metric(cell[0]) != metric:
            continue
        kind = SplitSpec.parse(cell[2]).kind
        for normalization, value in by_norm.items():
            for group in (kind, "all"):
                values[normalization][group].append(max(value, floor))
    return {
        norm: {kind: sum(v) / len(v) for kind, v in by_kind.items()}
        for norm, by_kind in sorted(values.items(), key=lambda item: _norm_order(item[0]))
    }


def write_report(paths: Sequence[Path], out_dir: Path) -> list[Path]:
    """Write Table III, the per-method means and the figures; returns the files written."""
    rows = read_results(paths)
    scores = mean_scores(rows)
    if not scores.means:
        raise InputError("the results hold no finished runs to report on")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [*_write_table3({r: count_pairs(scores, r) for r in READINGS}, out_dir),
               *_write_means(scores, out_dir), _write_health(training_health(rows), out_dir)]
    written += _plot_means(scores, out_dir)
    written += _plot_high_skew(scores, out_dir)
    written += _plot_families(scores, out_dir, "skew")
    written += _plot_families(scores, out_dir, "clients")
    written += _plot_sorted_r2(scores, out_dir)
    return written


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


HEALTH_GROUPS = ("federated", "local", *REFERENCE_NORMALIZATIONS)


def training_health(rows: Iterable[dict[str, str]]) -> list[Health]:
    """Per dataset: cap and single-class shares over the federated runs (references
    excluded), and mean scores of federated, local and reference runs (R² ≥ 0)."""
    table: dict[str, Health] = {}
    for row in rows:
        health = table.setdefault(row["dataset"], Health(row["dataset"]))
        spec = NormalizationSpec.parse(row["normalization"])
        group = str(spec) if spec.is_reference else spec.kind
        value = _number(row.get(METRIC.get(row["task"], ""), ""))
        if value is not None and group in HEALTH_GROUPS:
            health.scores[group].append(max(value, 0.0) if row["task"] == "regression"
                                        else value)
        if spec.is_reference:
            continue
        rounds, cap = _number(row.get("rounds", "")), _number(row.get("max_rounds", ""))
        if rounds is not None and cap is not None:
            health.trained_runs += 1
            health.at_cap += rounds >= cap
        classes = _number(row.get("test_predicted_classes", ""))
        if row["task"] == "classification" and classes is not None:
            health.classified_runs += 1
            health.one_class += classes <= 1
    return [table[name] for name in sorted(table)]


def _write_health(table: list[Health], out_dir: Path) -> Path:
    header = ["dataset", "runs", "share_at_round_cap", "share_single_class",
              *(f"mean_{g}" for g in HEALTH_GROUPS)]
    rows = [[h.dataset, h.trained_runs, _fmt(h.share(h.at_cap, h.trained_runs)),
             _fmt(h.share(h.one_class, h.classified_runs)),
             *(_fmt(sum(v) / len(v)) if (v := h.scores.get(g)) else "" for g in HEALTH_GROUPS)]
            for h in table]
    path = out_dir / "training_health.csv"
    _write_csv(path, header, rows)
    return path


def _write_means(scores: Scores, out_dir: Path) -> list[Path]:
    header = ["metric", "normalization", *IMBALANCE_TYPES, "all"]
    rows = []
    for metric in sorted(set(METRIC.values()) & {scores.metric(d) for d in scores.tasks}):
        for norm, by_kind in method_means(scores, metric).items():
            rows.append([metric, norm, *(_fmt(by_kind.get(k, math.nan))
                                         for k in (*IMBALANCE_TYPES, "all"))])
    _write_csv(out_dir / "method_means.csv", header, rows)
    return [out_dir / "method_means.csv"]


def _plot_means(scores: Scores, out_dir: Path) -> list[Path]:
    """Fig. 2: the mean score of each normalization over everything with that metric."""
    written = []
    for metric in ("test_f1", "test_r2"):
        means = method_means(scores, metric)
        if not means:
            continue
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(10, 4))
        names = list(means)
        ax.bar(names, [means[n]["all"] for n in names], color=[_color(n) for n in names])
        floored = " (R² < 0 counted as 0)" if metric == "test_r2" else ""
        ax.set_ylabel(f"mean {METRIC_LABEL[metric]}{floored}")
        ax.set_title(f"{METRIC_LABEL[metric]} averaged over datasets, clients and skews")
        _finish(ax, names, [means[n]["all"] for n in names])
        path = out_dir / f"fig2_mean_{metric.removeprefix('test_')}.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def _plot_high_skew(scores: Scores, out_dir: Path) -> list[Path]:
    """Fig. 3: F1 per dataset under IID and the strongest skew of each type, at each
    dataset's largest client count."""
    datasets = sorted(d for d in scores.tasks if scores.metric(d) == "test_f1")
    panels = {kind: {} for kind in IMBALANCE_TYPES}
    for dataset in datasets:
        for kind, cell in _strongest_cells(scores, dataset).items():
            panels[kind][dataset] = scores.means[cell]
    if not any(panels.values()):
        return []
    plt = _pyplot()
    names = sorted({n for panel in panels.values() for by in panel.values() for n in by},
                   key=_norm_order)
    fig, axes = plt.subplots(len(IMBALANCE_TYPES), 1, figsize=(12, 3 * len(IMBALANCE_TYPES)),
                             sharey=True)
    width = 0.8 / max(len(names), 1)
    for ax, kind in zip(axes, IMBALANCE_TYPES, strict=True):
        for i, name in enumerate(names):
            xs = [j + i * width for j in range(len(datasets))]
            ys = [panels[kind].get(d, {}).get(name, math.nan) for d in datasets]
            ax.bar(xs, ys, width, color=_color(name), label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(datasets))], datasets)
        ax.set_title("IID" if kind == "iid" else f"strongest {kind} skew")
        ax.set_ylabel("test F1")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, ncol=7, fontsize=8, loc="lower center")
    path = out_dir / "fig3_high_skew_f1.png"
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


FAMILIES = ("none", "local", "federated", "activation", "central_model")


def _family(normalization: str) -> str | None:
    spec = NormalizationSpec.parse(normalization)
    if spec.kind in ("none", "local", "federated", "activation"):
        return spec.kind
    return normalization if normalization == "central_model" else None


def family_means(scores: Scores, dataset: str, axis: str) -> dict[str, dict[str, float]]:
    """Per family (none, local, federated, activation norms, central model) the mean
    score (R² floored at 0) per skew or per client count of ``dataset``."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    floor = 0.0 if scores.metric(dataset) == "test_r2" else -math.inf
    for cell, by_norm in scores.means.items():
        if cell[0] != dataset:
            continue
        position = cell[2] if axis == "skew" else cell[1]
        for normalization, value in by_norm.items():
            family = _family(normalization)
            if family is not None:
                values[family][position].append(max(value, floor))
    return {family: {k: sum(v) / len(v) for k, v in by_position.items()}
            for family, by_position in values.items()}


def _plot_families(scores: Scores, out_dir: Path, axis: str) -> list[Path]:
    """Fig. 4 (per skew, averaged over client counts) and Fig. 5 (per client count,
    averaged over skews): one panel per dataset, bars per normalization family."""
    datasets = sorted(scores.tasks)
    if not datasets:
        return []
    plt = _pyplot()
    fig, axes = plt.subplots(len(datasets), 1, figsize=(11, 2.8 * len(datasets)),
                             squeeze=False)
    width = 0.8 / len(FAMILIES)
    for ax, dataset in zip(axes[:, 0], datasets, strict=True):
        means = family_means(scores, dataset, axis)
        positions = sorted({p for by in means.values() for p in by},
                           key=_skew_order if axis == "skew" else int)
        for i, family in enumerate(FAMILIES):
            xs = [j + i * width for j in range(len(positions))]
            ys = [means.get(family, {}).get(p, math.nan) for p in positions]
            ax.bar(xs, ys, width, color=_color(family if family != "activation"
                                                else "batch_norm"), label=family)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(positions))], positions)
        ax.set_ylabel(METRIC_LABEL[scores.metric(dataset)])
        ax.set_title(dataset)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, ncol=len(FAMILIES), fontsize=8, loc="lower center")
    over = "skew (over client counts)" if axis == "skew" else "client count (over skews)"
    fig.suptitle(f"mean score per {over}; families averaged over their methods; "
                 "R² < 0 counted as 0")
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    path = out_dir / ("fig4_per_skew.png" if axis == "skew" else "fig5_per_clients.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def _plot_sorted_r2(scores: Scores, out_dir: Path) -> list[Path]:
    """The paper's Parkinson's figure: R² per normalization under feature skew, averaged
    over client counts and σ, sorted."""
    values: dict[str, list[float]] = defaultdict(list)
    for cell, by_norm in scores.means.items():
        if scores.metric(cell[0]) == "test_r2" and SplitSpec.parse(cell[2]).kind == "feature":
            for normalization, value in by_norm.items():
                values[normalization].append(max(value, 0.0))
    if not values:
        return []
    means = sorted(((sum(v) / len(v), n) for n, v in values.items()), reverse=True)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    names = [n for _, n in means]
    ax.bar(names, [m for m, _ in means], color=[_color(n) for n in names])
    ax.set_ylabel("mean test R² (R² < 0 counted as 0)")
    ax.set_title("regression under feature skew, sorted")
    _finish(ax, names, [m for m, _ in means])
    path = out_dir / "fig_feature_skew_r2.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return [path]


def _skew_order(skew: str) -> tuple[int, float]:
    spec = SplitSpec.parse(skew)
    return IMBALANCE_TYPES.index(spec.kind), spec.param or 0.0


def _strongest_cells(scores: Scores, dataset: str) -> dict[str, CellKey]:
    """Per imbalance type, the cell with the most clients and the strongest skew
    (smallest β for label and quantity skew, largest σ for feature skew)."""
    cells = [c for c in scores.means if c[0] == dataset]
    most = max(int(c[1]) for c in cells)
    best: dict[str, CellKey] = {}
    for cell in (c for c in cells if int(c[1]) == most):
        kind = SplitSpec.parse(cell[2]).kind
        if kind not in best or _strength(cell[2]) > _strength(best[kind][2]):
            best[kind] = cell
    return best


def _strength(skew: str) -> float:
    spec = SplitSpec.parse(skew)
    if spec.param is None:
        return 0.0
    return spec.param if spec.kind == "feature" else -spec.param


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(ax: Any, names: list[str], values: list[float]) -> None:
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    finite = [v for v in values if math.isfinite(v)]
    if finite:
        low = min(finite)
        ax.set_ylim(max(0.0, low - 0.1) if low > 0 else low - 0.1, max(finite) + 0.05)


def _color(normalization: str) -> tuple[float, ...]:
    """One hue per family (local red, federated blue, pooled green, activation grey),
    a shade per method, so bars of one family stay apart."""
    from matplotlib import colormaps

    if normalization == "none":
        return (0.0, 0.0, 0.0, 1.0)
    if normalization in REFERENCE_NORMALIZATIONS:
        return (0.9, 0.6, 0.0, 1.0) if normalization == "central_model" else (0.6, 0.4, 0.0, 1.0)
    family, _, method = normalization.partition("_")
    maps = {"local": "Reds", "federated": "Blues", "pooled": "Greens"}
    members = list(METHODS) if family in maps else ["batch", "layer", "group", "instance"]
    key = method if family in maps else family
    shade = 0.45 + 0.5 * members.index(key) / len(members) if key in members else 0.7
    return colormaps[maps.get(family, "Greys")](shade)


def _norm_order(name: str) -> tuple[int, str]:
    order = [*PAPER_NORMALIZATIONS, *REFERENCE_NORMALIZATIONS]
    return (order.index(name), name) if name in order else (len(order), name)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _fmt(value: float) -> str:
    return "" if not math.isfinite(value) else f"{value:.4f}"


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with path.open("w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
