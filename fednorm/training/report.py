"""From results CSVs to the paper's Table III, per-method means, and Fig. 2/3-style plots.

Scores are test F1 for classification and test R² for regression, as in the paper.
A *cell* is one dataset × client count × skew (× privacy) setting; a normalization's
score in a cell is its mean over seeds. Table III compares, cell by cell and method by
method, ``federated_<m>`` with ``local_<m>``:

* a pair is a tie when |fed − local| < 0.005, else a win for the higher one;
* "mean fed. improvement" is the mean of fed − local over the pairs federated wins;
* for regression only pairs whose two R² means are both > 0 count (the paper includes
  only runs with R² > 0: a negative R² is a model worse than the mean, not a score).

The per-method means (and Fig. 2) count, by the same reading, an R² below 0 as 0: one
diverged run (a local Yeo-Johnson fitted on a handful of rows can send a test row to
R² ≈ −1e7) would otherwise swamp every other cell's mean.  The CSVs keep raw values.

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
from fednorm.training.normalization import PAPER_NORMALIZATIONS

TIE_MARGIN = 0.005
IMBALANCE_TYPES = ("iid", "quantity", "label", "feature")
METRIC = {"classification": "test_f1", "regression": "test_r2"}
METRIC_LABEL = {"test_f1": "test F1", "test_r2": "test R²"}

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


def count_pairs(scores: Scores) -> list[PairCounts]:
    """Table III: per dataset, how often federated beats local, loses, or ties."""
    table: dict[str, PairCounts] = {}
    for cell, by_norm in sorted(scores.means.items()):
        dataset = cell[0]
        counts = table.setdefault(dataset, PairCounts(dataset, scores.metric(dataset)))
        for method in METHODS:
            fed, local = by_norm.get(f"federated_{method}"), by_norm.get(f"local_{method}")
            if fed is None or local is None:
                continue
            if counts.metric == "test_r2" and not (fed > 0 and local > 0):
                continue
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
    scores = mean_scores(read_results(paths))
    if not scores.means:
        raise InputError("the results hold no finished runs to report on")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [*_write_table3(count_pairs(scores), out_dir),
               *_write_means(scores, out_dir)]
    written += _plot_means(scores, out_dir)
    written += _plot_high_skew(scores, out_dir)
    return written


def _write_table3(table: list[PairCounts], out_dir: Path) -> list[Path]:
    header = ["dataset", "metric", "federated", "local", "ties", "mean_fed_improvement"]
    rows = [[c.dataset, c.metric, c.federated, c.local, c.ties, _fmt(c.mean_improvement)]
            for c in table]
    total = ["Total", "", *(sum(c[i] for c in rows) for i in (2, 3, 4)), ""]
    _write_csv(out_dir / "table3.csv", header, [*rows, total])
    lines = ["| Dataset | Metric | Federated | Local | Ties | Mean Fed. Impr. |",
             "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {' | '.join(str(v) for v in row)} |" for row in [*rows, total]]
    (out_dir / "table3.md").write_text(
        "Federated vs local normalization, one pair per dataset × clients × skew × method "
        f"(mean over seeds); tie when |diff| < {TIE_MARGIN}; R² pairs only when both > 0.\n\n"
        + "\n".join(lines) + "\n", encoding="utf-8")
    return [out_dir / "table3.csv", out_dir / "table3.md"]


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
    family, _, method = normalization.partition("_")
    maps = {"local": "Reds", "federated": "Blues", "pooled": "Greens"}
    members = list(METHODS) if family in maps else ["batch", "layer", "group", "instance"]
    key = method if family in maps else family
    shade = 0.45 + 0.5 * members.index(key) / len(members) if key in members else 0.7
    return colormaps[maps.get(family, "Greys")](shade)


def _norm_order(name: str) -> tuple[int, str]:
    order = list(PAPER_NORMALIZATIONS)
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
