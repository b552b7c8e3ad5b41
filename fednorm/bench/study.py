"""The study's grid, timed as a researcher runs it: ``fednorm experiment --preset tabular
--jobs 2`` (3 datasets × 7 skews × 10/20/30 clients × every normalization × 3 seeds).

A grid is what the study costs to re-run after any change to training, so its wall time
has a target (at most 2 h at two worker processes on the 2-core machine the project is
measured on). The section drives the real grid (:func:`~fednorm.training.jobs.run_grid`
over :func:`~fednorm.training.grid.build_grid`'s cells) into a results file of its own in a
temporary directory, and reports its wall time and, per dataset, the runs, failures,
runs stopped by the round cap and the runs' summed seconds (normalization plus their
share of training). Needs the train extra (torch).
"""

from __future__ import annotations

import csv
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from fednorm.bench.measure import Section, met, now, step
from fednorm.training.grid import GridRequest, ResultStore, build_grid

TARGET_S = 2 * 3600.0
"""The tabular grid's target wall time at two worker processes."""

FULL = GridRequest(preset="tabular")
QUICK = GridRequest(preset="tabular", datasets=("bcw",), skews=("iid",), clients=(10,),
                    normalizations=("none", "federated_zscore"), seeds=(0,))


def study_grid(request: GridRequest, jobs: int, command: str = "",
               max_rounds: int | None = None) -> Section:
    """Run ``request``'s grid with ``jobs`` worker processes and report its cost.

    ``max_rounds`` caps training (smoke runs only: a capped grid is not the study's).
    """
    from fednorm.training.jobs import run_grid
    from fednorm.training.runner import RunSettings

    cells = build_grid(request)
    started, t0 = now()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "grid.csv"
        with ResultStore(out) as store, open(os.devnull, "w") as quiet:
            summary = run_grid(cells, store, RunSettings(max_rounds=max_rounds), jobs=jobs,
                               stream=quiet)
        wall = time.perf_counter() - t0
        with open(out, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    step(f"study grid, {summary.ran} runs", wall)
    per_dataset = _per_dataset(rows)
    cells_md = [[name, str(d["runs"]), str(d["failed"]), f"{d['at_cap']} ({_share(d)})",
                 f"{d['seconds'] / 60:.1f}"] for name, d in per_dataset.items()]
    record = {"runs": summary.ran, "failed": summary.failed, "jobs": jobs, "wall_s": wall,
              "target_s": TARGET_S, "per_dataset": per_dataset, "max_rounds": max_rounds}
    note = (f"The grid of `fednorm experiment --preset {request.preset} --jobs {jobs}`"
            + ("" if request == FULL else " restricted to a slice (a smoke run)")
            + (f", training capped at {max_rounds} rounds (not the study)" if max_rounds
               else "")
            + f": {summary.ran} runs in **{wall / 60:.1f} min** wall (target ≤ "
            f"{TARGET_S / 3600:.0f} h: {met(wall, TARGET_S)}), every run trained from "
            "scratch into a temporary results file (the committed `results/` are not read "
            "or written). "
            "Per dataset: runs, failed runs, runs that ended at their round cap, and the "
            "runs' summed seconds (each its normalization plus its share of its "
            "partition's training; with two worker processes they add up to about twice "
            "the wall time).")
    return Section("study", "The study's tabular grid, timed", [record],
                   [("", ["dataset", "runs", "failed", "at the round cap", "run minutes"],
                     cells_md)],
                   [note], {"date": started.strftime("%Y-%m-%d %H:%M UTC"),
                            "command": command, "wall time": f"{wall / 60:.1f} min"})


def _per_dataset(rows: list[dict[str, str]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(
        lambda: {"runs": 0, "failed": 0, "at_cap": 0, "trained": 0, "seconds": 0.0})
    for row in rows:
        d = out[row["dataset"]]
        d["runs"] += 1
        d["failed"] += row["status"] != "ok"
        d["seconds"] += float(row["seconds"] or 0.0)
        if row["rounds"]:  # trained (the linear reference is fitted, not trained)
            d["trained"] += 1
            d["at_cap"] += row["rounds"] == row["max_rounds"]
    return dict(out)


def _share(d: dict[str, float]) -> str:
    return f"{100 * d['at_cap'] / d['trained']:.1f} %" if d["trained"] else "–"
