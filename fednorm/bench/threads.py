"""Threads layout: worker threads × OpenMP threads for one PPF protocol at P parties.

Each layout runs ``fednorm simulate`` in a fresh process (OpenMP reads
``OMP_NUM_THREADS`` once, at start; the simulation reads ``FEDNORM_WORKER_THREADS``), and
the run's own ``seconds`` (the federation, without process start and context build) is
compared. Layouts alternate run by run, so a drift of the machine's load spreads evenly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fednorm.bench.measure import Section, median, now, step

LAYOUTS = ((1, 1), (1, 2), (2, 1), (2, 2))  # (worker threads, OpenMP threads)


def _run(method: str, parties: int, preset: str, workers: int, omp: int) -> float:
    env = {**os.environ, "FEDNORM_WORKER_THREADS": str(workers), "OMP_NUM_THREADS": str(omp)}
    out = subprocess.run(
        [sys.executable, "-m", "fednorm", "simulate", "--method", method, "--privacy", "mhe",
         "--preset", preset, "--parties", str(parties), "--json", "--quiet"],
        env=env, capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)["seconds"])


def threads_layout(method: str = "zscore", parties: int = 10, preset: str = "paper",
                   repeats: int = 2, command: str = "",
                   layouts: tuple[tuple[int, int], ...] = LAYOUTS) -> Section:
    """Median seconds of ``method`` per (worker threads, OpenMP threads) layout."""
    started, _ = now()
    seconds: dict[tuple[int, int], list[float]] = {layout: [] for layout in layouts}
    for _ in range(repeats):
        for workers, omp in layouts:
            t = _run(method, parties, preset, workers, omp)
            seconds[workers, omp].append(t)
            step(f"threads {workers}×{omp}", t)
    best = min(layouts, key=lambda layout: median(seconds[layout]))
    rows = [{"workers": w, "omp": o, "median_s": median(seconds[w, o]), "runs_s": seconds[w, o]}
            for w, o in layouts]
    cells = [[str(r["workers"]), str(r["omp"]), f"{r['median_s']:.2f}",
              ", ".join(f"{s:.2f}" for s in r["runs_s"]),
              "**fastest**" if (r["workers"], r["omp"]) == best else ""] for r in rows]
    notes = [f"`fednorm simulate --method {method} --privacy mhe --preset {preset} --parties "
             f"{parties}` in a fresh process per run, with `FEDNORM_WORKER_THREADS` (crypto "
             "calls at once) and `OMP_NUM_THREADS` (threads inside each OpenFHE call) set; "
             f"the run's own seconds, {repeats} run(s) per layout, layouts alternating."]
    return Section("threads", f"Threads layout — {method}, {parties} parties", rows,
                   [("", ["worker threads", "OpenMP threads", "median s", "runs s", ""],
                     cells)], notes,
                   {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "command": command})
