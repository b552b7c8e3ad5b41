"""``fednorm simulate``: a whole federation in memory, compared with the pooled fit.

It loads a dataset, splits it over P parties, runs a
normalization protocol between them in memory, and compares the result with the
same normalization fitted on the pooled data.
"""

from __future__ import annotations

import argparse
import json
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import numpy as np

from fednorm.cli.options import add_fit_options, fit_options
from fednorm.cli.progress import add_quiet_option, progress_for
from fednorm.engine.clock import run_trio
from fednorm.protocols import METHODS, Normalizer, fit_local
from fednorm.protocols.methods import split_methods
from fednorm.session import SessionPlan, check_options_used
from fednorm.sim.csv_files import load_csv
from fednorm.sim.federation import (
    SimulationReport,
    SimulationResult,
    play_federation,
)
from fednorm.sim.partition import SplitSpec, partition


@dataclass
class Comparison:
    """Federated parameters beside the pooled ones, with the worst errors."""

    federated: dict[str, list[float]]
    pooled: dict[str, list[float]]
    max_abs_error: float
    max_rel_error: float


SPREAD_POWER = {"var": 2, "lambda": 0}
"""Each parameter's units as a power of the feature's spread (1 for the rest: values)."""


def compare(federated: Normalizer, pooled: Normalizer, spread: np.ndarray) -> Comparison:
    """The worst absolute error and the worst relative error, |federated − pooled| /
    max(|pooled|, the feature's spread in the parameter's units): a statistic near 0
    (a centered feature's mean) is judged against the feature's spread, not against
    itself.  ``spread`` per feature: the pooled data's standard deviation (Yeo-Johnson's
    mean and variance: the transformed data's, its pooled variance's root)."""
    fed, ref = federated.params(), pooled.params()
    abs_errors, rel_errors = [0.0], [0.0]
    for name in fed:
        a, b = np.asarray(fed[name]), np.asarray(ref[name])
        scale = spread ** SPREAD_POWER.get(name, 1)
        if name in ("mean", "var") and "lambda" in ref:  # of the transformed data
            scale = np.sqrt(np.asarray(ref["var"])) ** SPREAD_POWER.get(name, 1)
        both = np.isfinite(a) & np.isfinite(b)
        diff = np.abs(a[both] - b[both])
        abs_errors.extend(diff)
        unit = np.fmax(np.abs(b[both]), np.nan_to_num(scale[both]))
        rel_errors.extend(diff[unit > 0] / unit[unit > 0])
    return Comparison(fed, ref, float(max(abs_errors)), float(max(rel_errors)))


def feature_spread(X: np.ndarray) -> np.ndarray:
    """Each feature's population standard deviation over its present values (0 where it
    has none)."""
    count = np.maximum(np.sum(~np.isnan(X), axis=0), 1)
    mean = np.nansum(X, axis=0) / count
    with np.errstate(over="ignore", invalid="ignore"):
        return np.nan_to_num(np.sqrt(np.nansum((X - mean) ** 2, axis=0) / count))


def _json_floats(params: dict[str, list[float]]) -> dict[str, list[float | None]]:
    """NaN is not JSON: features without values report null."""
    return {k: [v if np.isfinite(v) else None for v in vs] for k, vs in params.items()}


@dataclass
class MethodRun:
    """One method of a ``simulate`` session, with its comparison to the pooled fit."""

    method: str
    result: SimulationResult
    comparison: Comparison


@dataclass
class SimulateOutcome:
    """A ``simulate`` session: the features, the key setup's cost (mhe), each method."""

    features: list[str]
    setup: SimulationReport | None
    runs: list[MethodRun]

    @property
    def methods(self) -> list[str]:
        """The methods run, as the plan named them."""
        return [run.method for run in self.runs]


def simulate_command(args: argparse.Namespace) -> int:
    outcome = run_simulation(args)
    if args.json:
        print(json.dumps(json_report(args, outcome)))
    else:
        print(human_session_report(args, outcome))
    return 0


def run_simulation(args: argparse.Namespace) -> SimulateOutcome:
    """One ``simulate`` run from its options, compared with the pooled fit. One method
    runs alone (in mhe mode its report includes its key setup); several run as a session:
    in mhe mode one key setup, reported apart, then every method on those keys."""
    split = SplitSpec.parse(args.split)
    options = fit_options(args, replay=not args.no_replay)
    plan = SessionPlan(args.method, args.privacy)  # the run's one check of its methods
    check_options_used(plan.protocols, options)
    dataset = load_csv(args.dataset, args.target)
    parts = partition(dataset.X, dataset.y, args.parties, split, seed=args.seed)
    label = ",".join(plan.methods)
    progress = progress_for(args, f"fednorm {args.command} {label}-{args.privacy}")
    # Overflow is reported as an error (check_no_overflow), not as numpy warnings.
    with progress or nullcontext(), np.errstate(over="ignore", invalid="ignore"):
        arrays = [p.X for p in parts]
        session = run_trio(partial(play_federation, plan, arrays, options,
                                   features=dataset.feature_names, tracer=progress))
        # The reference: the pooled rows the parties hold (a feature split adds noise).
        held = np.vstack(arrays)
        runs = [MethodRun(method, result, compare(result.normalizer,
                                                  fit_local(method, held, options),
                                                  feature_spread(held)))
                for method, result in zip(plan.methods, session.results, strict=True)]
    return SimulateOutcome(dataset.feature_names, session.setup, runs)


def json_report(args: argparse.Namespace, outcome: SimulateOutcome) -> dict[str, object]:
    """One method: its report; several: the key setup and one report per method."""
    runs = [_json_run(args, outcome.features, run) for run in outcome.runs]
    if len(runs) == 1:
        return runs[0]
    setup = None if outcome.setup is None else {
        "rounds": outcome.setup.rounds, "bytes": outcome.setup.bytes_total,
        "seconds": outcome.setup.seconds}
    return {"methods": outcome.methods, "privacy": args.privacy, "parties": args.parties,
            "split": args.split, "features": outcome.features, "setup": setup, "runs": runs}


def _json_run(args: argparse.Namespace, features: list[str], run: MethodRun
              ) -> dict[str, object]:
    cmp, report = run.comparison, run.result.report
    return {
        "method": run.method,
        "privacy": args.privacy,
        "parties": args.parties,
        "split": args.split,
        "features": features,
        "params": _json_floats(cmp.federated),
        "pooled": _json_floats(cmp.pooled),
        "max_abs_error": cmp.max_abs_error,
        "max_rel_error": cmp.max_rel_error,
        "rounds": report.rounds,
        "bytes": report.bytes_total,
        "seconds": report.seconds,
    }


def human_session_report(args: argparse.Namespace, outcome: SimulateOutcome) -> str:
    """Each method's table; in mhe mode the key setup's cost first."""
    blocks = []
    if outcome.setup is not None:
        setup = outcome.setup
        blocks.append(f"joint key setup ({_privacy_label(args)}) for "
                      f"{', '.join(outcome.methods)}: {setup.rounds} rounds, "
                      f"{setup.bytes_total:,} bytes, {setup.seconds:.3f} s "
                      "(each method below reuses the keys)")
    blocks += [human_report(args, outcome.features, run) for run in outcome.runs]
    return "\n\n".join(blocks)


def human_report(args: argparse.Namespace, features: list[str], run: MethodRun) -> str:
    cmp = run.comparison
    names = list(cmp.federated)
    width = max(len(f) for f in features)
    lines = [
        f"{run.method} ({_privacy_label(args)}) on {args.dataset}: {args.parties} parties, "
        f"split {args.split}, seed {args.seed}",
        "  ".join([f"{'feature':<{width}}"]
                  + [f"{n + ' fed':>14} {n + ' pooled':>14} {'abs err':>9}" for n in names]),
    ]
    for j, feature in enumerate(features):
        cells = [f"{feature:<{width}}"]
        for n in names:
            a, b = cmp.federated[n][j], cmp.pooled[n][j]
            cells.append(f"{a:>14.6g} {b:>14.6g} {abs(a - b):>9.2e}")
        lines.append("  ".join(cells))
    report = run.result.report
    lines.append(
        f"max abs error {cmp.max_abs_error:.3e}, max rel error {cmp.max_rel_error:.3e}; "
        f"{report.rounds} rounds, {report.bytes_total:,} bytes, {report.seconds:.3f} s"
    )
    return "\n".join(lines)


def _privacy_label(args: argparse.Namespace) -> str:
    return f"mhe, {args.ckks_preset} preset" if args.privacy == "mhe" else args.privacy


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("simulate", help="run a federation in memory and compare to pooled")
    p.add_argument("--dataset", default="bcw", help="'bcw' (built in) or a CSV path")
    p.add_argument("--target", help="target column of a CSV (kept out of the features)")
    p.add_argument("--parties", type=int, default=10, help="number of parties (default 10)")
    p.add_argument("--split", default="iid",
                   help="iid | label:β | quantity:β | feature:σ (default iid)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the partition and its noise (default 0)")
    p.add_argument("--method", type=split_methods, default=("zscore",),
                   help=f"one of {', '.join(METHODS)}, or several separated by commas: "
                   "with --privacy mhe they share one joint key setup (default zscore)")
    p.add_argument("--privacy", choices=("plain", "mhe"), default="plain")
    add_fit_options(p)
    p.add_argument("--no-replay", action="store_true",
                   help="mhe --algorithm paper: the parties take the server's steps on "
                        "trust instead of recomputing each to check its requests (every "
                        "role runs in this process; a multi-host party always checks)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object on stdout; errors are against the pooled rows the "
                        "parties hold, max_rel_error in units of max(|pooled value|, the "
                        "feature's spread)")
    add_quiet_option(p)
    p.set_defaults(handler=simulate_command)
