"""Batched (all clients at once) vs one-client-at-a-time FedAvg training, side by side.

Needs the train extra (torch); not part of ``fednorm bench``.

The same BCW run — 30 clients, IID split, federated z-score, the paper's MLP, batch 8 —
is trained for a fixed number of rounds (no early stopping, so both do identical work)
by :class:`BatchedRound` and by :class:`SequentialRound`, alternating repeat by repeat so
that both see the same machine load. Prints the median seconds of each and their ratio,
and checks that both ended at the same weights.

    .venv/bin/python -m fednorm.bench.training [--rounds 20] [--repeats 5] [--threads 1]

``--parkinsons`` times instead the study's slowest partition, Parkinson's with 10
clients (IID, seed 0), for a fixed number of rounds (no early stopping): one run
(federated z-score) alone, then all 13 normalizations run one at a time and stacked
(runs of one architecture trained together), alternating repeat by repeat. The
one-run timing uses only ``run_cell``, so it also runs against an older checkout that
has this module (before it moved into the package it was a script beside the bench):

    git archive <commit> fednorm | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before .venv/bin/python -m fednorm.bench.training --parkinsons
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch

from fednorm.sim.datasets import load_dataset
from fednorm.training.data import make_clients, merge_val
from fednorm.training.fedavg import ClientTensors, TrainConfig, train_federated
from fednorm.training.grid import Cell
from fednorm.training.models import build_model, model_spec
from fednorm.training.normalization import (
    PAPER_NORMALIZATIONS,
    NormalizationSpec,
    normalize_clients,
)
from fednorm.training.rounds import BatchedRound, SequentialRound
from fednorm.training.runner import RunSettings, run_cell
from fednorm.training.tensors import client_tensors, eval_tensors


def setup(clients: int) -> tuple[ClientTensors, tuple]:
    """The federated-z-score-normalized BCW clients and the server's validation rows."""
    parts = make_clients(load_dataset("bcw"), clients, "iid", seed=0)
    normalized = normalize_clients(parts, NormalizationSpec.parse("federated_zscore")).clients
    val = merge_val(normalized)
    return client_tensors(normalized, "classification"), eval_tensors(val, "classification")


def run(round_type: type, data: ClientTensors, val: tuple, activation: str,
        config: TrainConfig) -> tuple[float, dict]:
    torch.manual_seed(0)
    model = build_model(model_spec("bcw", None), data.X.shape[1], 2, activation)
    started = time.perf_counter()
    outcome = train_federated(model, round_type(model, data, "classification", config), val,
                              "classification", config)
    return time.perf_counter() - started, outcome.state


def parkinsons(rounds: int, repeats: int, data_dir: str | None) -> None:
    """One Parkinson's run alone, and a whole partition one run at a time vs stacked."""
    settings = RunSettings(data_dir=data_dir, max_rounds=rounds, patience=rounds + 1)
    cells = [Cell("parkinsons", "iid", 10, name, 0) for name in PAPER_NORMALIZATIONS]
    can_stack = "stack" in {f.name for f in dataclasses.fields(RunSettings)}
    modes = {"one run (federated_zscore)": lambda: [run_cell(cells[5], settings)]}
    if can_stack:
        from fednorm.training.runner import run_cells

        modes["13 runs, one at a time"] = lambda: run_cells(
            cells, dataclasses.replace(settings, stack=False))
        modes["13 runs, stacked"] = lambda: run_cells(cells, settings)
    times: dict[str, list[float]] = {name: [] for name in modes}
    results: dict[str, list] = {}
    for _ in range(repeats):
        for name, mode in modes.items():
            started = time.perf_counter()
            results[name] = mode()
            times[name].append(time.perf_counter() - started)
    print(f"Parkinson's, 10 clients, IID, seed 0, {rounds} rounds, {repeats} repeats, "
          f"fednorm from {os.path.dirname(fednorm_file())}")
    for name, values in times.items():
        runs = ", ".join(f"{t:.1f}" for t in values)
        print(f"  {name:<28} median {statistics.median(values):.1f} s  ({runs})")
    if can_stack:
        alone = {c.normalization: r["test_r2"] for c, r in results["13 runs, one at a time"]}
        stacked = {c.normalization: r["test_r2"] for c, r in results["13 runs, stacked"]}
        drift = max(abs(float(alone[n]) - float(stacked[n])) for n in alone)
        print(f"  max |test R² one at a time - stacked| = {drift:.1e}")


def fednorm_file() -> str:
    import fednorm

    return str(fednorm.__file__)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--activation", default="none", help="none|batch|layer|group|instance")
    parser.add_argument("--parkinsons", action="store_true",
                        help="time the Parkinson's partition instead (see the module doc)")
    parser.add_argument("--data-dir", help="folder with parkinsons_updrs.csv")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.parkinsons:
        parkinsons(args.rounds, args.repeats, args.data_dir)
        return
    data, val = setup(args.clients)
    config = TrainConfig(batch_size=8, max_rounds=args.rounds, patience=args.rounds + 1)
    times: dict[str, list[float]] = {"batched": [], "sequential": []}
    states = {}
    run(BatchedRound, data, val, args.activation, config)  # warm-up: first-call costs
    for _ in range(args.repeats):
        for name, round_type in (("batched", BatchedRound), ("sequential", SequentialRound)):
            seconds, states[name] = run(round_type, data, val, args.activation, config)
            times[name].append(seconds)
    batched, sequential = (statistics.median(times[n]) for n in ("batched", "sequential"))
    drift = max(float((states["batched"][k] - states["sequential"][k]).abs().max())
                for k in states["batched"])
    print(f"BCW, {args.clients} clients, {args.rounds} rounds, activation {args.activation}, "
          f"{args.threads} thread(s), {args.repeats} repeats")
    for name, median in (("batched", batched), ("sequential", sequential)):
        runs = ", ".join(f"{t:.3f}" for t in times[name])
        print(f"  {name:<10} median {median:.3f} s  ({runs})")
    print(f"  speed-up {sequential / batched:.1f}x; max weight difference {drift:.1e}")


if __name__ == "__main__":
    main()
