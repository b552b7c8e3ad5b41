"""Plain federated protocols against scikit-learn's fit on the pooled rows.

Each protocol runs as ``fednorm simulate`` runs it (all roles in one process, the
in-memory transport, every message encoded and parsed); the reference is the
scikit-learn scaler fitted on the pooled array. Both are timed best-of-``repeats`` on
the same data in the same run, so their ratio is what the report quotes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from fednorm.bench.measure import Section, now, sci, step
from fednorm.bench.oracle import errors_text, estimate_errors
from fednorm.sim.federation import simulate

SHAPES = ((10_000, 50), (50_000, 50))
QUICK_SHAPES = ((2_000, 10),)
METHODS = ("zscore", "minmax", "robust", "yeojohnson")


def _sklearn_fit(method: str) -> Callable[[np.ndarray], object]:
    from sklearn.preprocessing import MinMaxScaler, PowerTransformer, RobustScaler, StandardScaler

    scaler = {"zscore": StandardScaler, "minmax": MinMaxScaler, "robust": RobustScaler,
              "yeojohnson": PowerTransformer}[method]
    return lambda X: scaler().fit(X)


def skewed_data(rows: int, features: int, seed: int = 0) -> np.ndarray:
    """Log-normal columns of different scales, shifted so that most hold both signs."""
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.1, 100.0, size=features)
    shift = rng.uniform(0.0, 5.0, size=features)
    return rng.lognormal(size=(rows, features)) * scale - shift


def _best_seconds(run: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return best


def plain_vs_sklearn(shapes: tuple[tuple[int, int], ...], parties: int, repeats: int,
                     command: str = "") -> Section:
    """One row per (shape, method): fednorm's plain protocol, scikit-learn, ratio, error."""
    started, _ = now()
    rows, cells = [], []
    for n_rows, n_features in shapes:
        X = skewed_data(n_rows, n_features)
        parts = np.array_split(X, parties)
        for method in METHODS:
            fitted = simulate(parts, method).normalizer
            ours = _best_seconds(lambda: simulate(parts, method), repeats)  # noqa: B023
            reference = _best_seconds(lambda: _sklearn_fit(method)(X), repeats)  # noqa: B023
            step(f"plain {method} {n_rows}×{n_features}", ours + reference)
            relative, absolute = estimate_errors(method, fitted, X)
            rows.append({"method": method, "rows": n_rows, "features": n_features,
                         "parties": parties, "fednorm_s": ours, "sklearn_s": reference,
                         "ratio": ours / reference, "relative_error": relative})
            cells.append([method, f"{n_rows:,} × {n_features}", f"{ours:.3f}",
                          f"{reference:.3f}", f"{ours / reference:.1f}×",
                          errors_text(relative, absolute)])
    notes = [f"fednorm: `simulate(parts, method)` over {parties} parties (plain, in-memory "
             f"transport, all roles in one process); scikit-learn: `StandardScaler`, "
             "`MinMaxScaler`, `RobustScaler`, `PowerTransformer` fitted on the pooled "
             f"array. Best of {repeats} runs each, side by side in this run. Data: "
             "log-normal columns of scales 0.1–100 shifted to hold both signs (seed 0). "
             f"Errors against numpy / scikit-learn on the pooled rows ({sci(0.0)} = equal)."]
    return Section("plain", f"Plain protocols against scikit-learn, {parties} parties", rows,
                   [("", ["method", "data", "fednorm (s)", "scikit-learn (s)", "ratio",
                          "max error vs pooled"], cells)],
                   notes, {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "command": command})
