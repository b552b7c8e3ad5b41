"""Fig. 2-5-style plots of the study's scores (matplotlib, imported only to draw).

Means count an R² below 0 as 0 (see :mod:`fednorm.training.scores`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fednorm.protocols import METHODS
from fednorm.sim.partition import SplitSpec
from fednorm.training.normalization import (
    REFERENCE_NORMALIZATIONS,
    NormalizationSpec,
)
from fednorm.training.scores import (
    IMBALANCE_TYPES,
    METRIC_LABEL,
    CellKey,
    Scores,
    datasets_of,
    method_means,
    norm_order,
)

Bars = Callable[[Scores], list[float]]  # a figure's bar heights from some scores


def plot_all(scores: Scores, out_dir: Path, per_seed: list[Scores] | None = None
             ) -> list[Path]:
    """Every figure of the report; returns the files written. ``per_seed``: the scores
    of each seed alone (:func:`fednorm.training.scores.per_seed_scores`); every bar
    then carries the range of its per-seed values."""
    seeds = per_seed or []
    return [*_plot_means(scores, out_dir, seeds), *_plot_high_skew(scores, out_dir, seeds),
            *_plot_families(scores, out_dir, "skew", seeds),
            *_plot_families(scores, out_dir, "clients", seeds),
            *_plot_sorted_r2(scores, out_dir, seeds)]


def seed_errors(bars: Bars, scores: Scores, per_seed: list[Scores]) -> list[list[float]]:
    """matplotlib's ``yerr`` for the bars ``bars(scores)``: how far each lies above its
    lowest and below its highest per-seed value (0 where no seed has one)."""
    heights = bars(scores)
    by_seed = [bars(seed) for seed in per_seed]
    low, high = [], []
    for i, height in enumerate(heights):
        values = [b[i] for b in by_seed if math.isfinite(b[i])]
        finite = bool(values) and math.isfinite(height)
        low.append(max(height - min(values), 0.0) if finite else 0.0)
        high.append(max(max(values) - height, 0.0) if finite else 0.0)
    return [low, high]


def _plot_means(scores: Scores, out_dir: Path, per_seed: list[Scores]) -> list[Path]:
    """Fig. 2: the mean score of each normalization, with the range of its per-seed
    means; F1 over every classification dataset together (as the paper), R² one panel
    per regression dataset (Parkinson's by patient and by row measure different
    things). A bar that averages fewer datasets than the others (instance norm: images
    only) names its datasets under it."""
    written = []
    for metric in ("test_f1", "test_r2"):
        found = sorted(d for d in scores.tasks if scores.metric(d) == metric)
        panels = [set(found)] if metric == "test_f1" else [{d} for d in found]
        if not found:
            continue
        plt = _pyplot()
        fig, axes = plt.subplots(len(panels), 1, figsize=(10, 4.8 * len(panels)),
                                 squeeze=False)
        for ax, datasets in zip(axes[:, 0], panels, strict=True):
            _draw_means(ax, scores, per_seed, metric, datasets)
        path = out_dir / f"fig2_mean_{metric.removeprefix('test_')}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def _draw_means(ax: Any, scores: Scores, per_seed: list[Scores], metric: str,
                datasets: set[str]) -> None:
    """One Fig. 2 panel: the normalizations' means over ``datasets``."""
    names = list(method_means(scores, metric, datasets))

    def bars(some: Scores) -> list[float]:
        found = method_means(some, metric, datasets)
        return [found.get(n, {}).get("all", math.nan) for n in names]

    heights = bars(scores)
    ax.bar(names, heights, color=[_color(n) for n in names], capsize=2,
           yerr=seed_errors(bars, scores, per_seed))
    floored = " (R² < 0 counted as 0)" if metric == "test_r2" else ""
    ax.set_ylabel(f"mean {METRIC_LABEL[metric]}{floored}")
    sets = datasets_of(scores, metric, datasets)
    everything = set().union(*sets.values())
    ax.set_title(f"{METRIC_LABEL[metric]} averaged over clients and skews of "
                 f"{', '.join(sorted(everything))}; whiskers: range of the seed means")
    _finish(ax, [n if sets.get(n) == everything else f"{n} ({', '.join(sorted(sets[n]))})"
                 for n in names], heights)


def _plot_high_skew(scores: Scores, out_dir: Path, per_seed: list[Scores]) -> list[Path]:
    """Fig. 3: F1 per dataset under IID and the strongest skew of each type, at each
    dataset's largest client count."""
    datasets = sorted(d for d in scores.tasks if scores.metric(d) == "test_f1")
    panels: dict[str, dict[str, CellKey]] = {kind: {} for kind in IMBALANCE_TYPES}
    for dataset in datasets:
        for kind, cell in _strongest_cells(scores, dataset).items():
            panels[kind][dataset] = cell
    if not any(panels.values()):
        return []
    plt = _pyplot()
    names = sorted({n for panel in panels.values() for cell in panel.values()
                    for n in scores.means[cell]}, key=norm_order)
    fig, axes = plt.subplots(len(IMBALANCE_TYPES), 1, figsize=(12, 3 * len(IMBALANCE_TYPES)),
                             sharey=True)
    width = 0.8 / max(len(names), 1)
    for ax, kind in zip(axes, IMBALANCE_TYPES, strict=True):
        for i, name in enumerate(names):
            def bars(some: Scores, name: str = name, cells: dict = panels[kind]
                     ) -> list[float]:
                return [some.means.get(cells[d], {}).get(name, math.nan) if d in cells
                        else math.nan for d in datasets]

            xs = [j + i * width for j in range(len(datasets))]
            ax.bar(xs, bars(scores), width, color=_color(name), label=name,
                   yerr=seed_errors(bars, scores, per_seed), error_kw={"elinewidth": 0.5})
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


def _plot_families(scores: Scores, out_dir: Path, axis: str, per_seed: list[Scores]
                   ) -> list[Path]:
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
            def bars(some: Scores, family: str = family, dataset: str = dataset,
                     positions: list[str] = positions) -> list[float]:
                found = family_means(some, dataset, axis) if dataset in some.tasks else {}
                return [found.get(family, {}).get(p, math.nan) for p in positions]

            xs = [j + i * width for j in range(len(positions))]
            ax.bar(xs, bars(scores), width, yerr=seed_errors(bars, scores, per_seed),
                   color=_color(family if family != "activation" else "batch_norm"),
                   label=family, error_kw={"elinewidth": 0.6})
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(positions))], positions)
        ax.set_ylabel(METRIC_LABEL[scores.metric(dataset)])
        ax.set_title(dataset)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, ncol=len(FAMILIES), fontsize=8, loc="lower center")
    over = "skew (over client counts)" if axis == "skew" else "client count (over skews)"
    fig.suptitle(f"mean score per {over}, families over their methods, R² < 0 as 0;\n"
                 "whiskers: range of the seed means")
    fig.tight_layout(rect=(0, 0.04, 1, 0.96))
    path = out_dir / ("fig4_per_skew.png" if axis == "skew" else "fig5_per_clients.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def _plot_sorted_r2(scores: Scores, out_dir: Path, per_seed: list[Scores]) -> list[Path]:
    """The paper's Parkinson's figure: R² per normalization under feature skew, averaged
    over client counts and σ, sorted; one panel per regression dataset (Parkinson's by
    patient and by row measure different things, so they are not averaged together)."""
    datasets = sorted(d for d in scores.tasks if scores.metric(d) == "test_r2")
    if not datasets:
        return []
    plt = _pyplot()
    fig, axes = plt.subplots(len(datasets), 1, figsize=(10, 4.6 * len(datasets)),
                             squeeze=False)
    for ax, dataset in zip(axes[:, 0], datasets, strict=True):
        means = feature_skew_r2(scores, dataset)
        names = sorted(means, key=lambda n, means=means: -means[n])

        def bars(some: Scores, dataset: str = dataset, names: list[str] = names
                 ) -> list[float]:
            found = feature_skew_r2(some, dataset)
            return [found.get(n, math.nan) for n in names]

        ax.bar(names, bars(scores), color=[_color(n) for n in names], capsize=2,
               yerr=seed_errors(bars, scores, per_seed))
        ax.set_ylabel("mean test R² (R² < 0 counted as 0)")
        ax.set_title(f"{dataset} under feature skew, sorted; whiskers: range of the seed "
                     "means")
        _finish(ax, names, bars(scores))
    path = out_dir / "fig_feature_skew_r2.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return [path]


def feature_skew_r2(scores: Scores, dataset: str) -> dict[str, float]:
    """Per normalization, the mean R² (floored at 0) over ``dataset``'s feature-skew
    cells."""
    values: dict[str, list[float]] = defaultdict(list)
    for cell, by_norm in scores.means.items():
        if cell[0] == dataset and SplitSpec.parse(cell[2]).kind == "feature":
            for normalization, value in by_norm.items():
                values[normalization].append(max(value, 0.0))
    return {n: sum(v) / len(v) for n, v in values.items()}


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
        whiskers_top = ax.get_ylim()[1]  # autoscaled: it covers the seed-range whiskers
        ax.set_ylim(max(0.0, low - 0.1) if low > 0 else low - 0.1,
                    max(max(finite) + 0.05, whiskers_top))


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

