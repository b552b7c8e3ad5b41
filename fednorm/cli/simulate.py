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

import numpy as np

from fednorm.cli.options import add_fit_options, fit_options
from fednorm.cli.progress import add_quiet_option, progress_for
from fednorm.multihost.files import load_csv
from fednorm.protocols import METHODS, Normalizer, fit_local
from fednorm.sim.federation import SimulationResult, simulate
from fednorm.sim.partition import SplitSpec, partition


@dataclass
class Comparison:
    """Federated parameters beside the pooled ones, with the worst errors."""

    federated: dict[str, list[float]]
    pooled: dict[str, list[float]]
    max_abs_error: float
    max_rel_error: float


def compare(federated: Normalizer, pooled: Normalizer) -> Comparison:
    fed, ref = federated.params(), pooled.params()
    abs_errors, rel_errors = [0.0], [0.0]
    for name in fed:
        a, b = np.asarray(fed[name]), np.asarray(ref[name])
        both = np.isfinite(a) & np.isfinite(b)
        diff = np.abs(a[both] - b[both])
        abs_errors.extend(diff)
        nonzero = b[both] != 0
        rel_errors.extend(diff[nonzero] / np.abs(b[both][nonzero]))
    return Comparison(fed, ref, float(max(abs_errors)), float(max(rel_errors)))


def _json_floats(params: dict[str, list[float]]) -> dict[str, list[float | None]]:
    """NaN is not JSON: features without values report null."""
    return {k: [v if np.isfinite(v) else None for v in vs] for k, vs in params.items()}


def simulate_command(args: argparse.Namespace) -> int:
    features, result, comparison = run_simulation(args)
    if args.json:
        print(json.dumps(_json_report(args, features, result, comparison)))
    else:
        print(human_report(args, features, result, comparison))
    return 0


def run_simulation(args: argparse.Namespace
                   ) -> tuple[list[str], SimulationResult, Comparison]:
    """One ``simulate`` run from its options: the features, the result, the comparison."""
    split = SplitSpec.parse(args.split)
    options = fit_options(args)
    dataset = load_csv(args.dataset, args.target)
    parts = partition(dataset.X, dataset.y, args.parties, split, seed=args.seed)
    progress = progress_for(args, f"fednorm simulate {args.method}-{args.privacy}")
    # Overflow is reported as an error (check_no_overflow), not as numpy warnings.
    with progress or nullcontext(), np.errstate(over="ignore", invalid="ignore"):
        result = simulate([p.X for p in parts], args.method, args.privacy, options,
                          features=dataset.feature_names, tracer=progress)
        pooled = fit_local(args.method, dataset.X, options)
    return dataset.feature_names, result, compare(result.normalizer, pooled)


def _json_report(
    args: argparse.Namespace, features: list[str], result: SimulationResult, cmp: Comparison
) -> dict[str, object]:
    return {
        "method": args.method,
        "privacy": args.privacy,
        "parties": args.parties,
        "split": args.split,
        "features": features,
        "params": _json_floats(cmp.federated),
        "pooled": _json_floats(cmp.pooled),
        "max_abs_error": cmp.max_abs_error,
        "max_rel_error": cmp.max_rel_error,
        "rounds": result.report.rounds,
        "bytes": result.report.bytes_total,
        "seconds": result.report.seconds,
    }


def human_report(
    args: argparse.Namespace, features: list[str], result: SimulationResult, cmp: Comparison
) -> str:
    names = list(cmp.federated)
    width = max(len(f) for f in features)
    lines = [
        f"{args.method} ({_privacy_label(args)}) on {args.dataset}: {args.parties} parties, "
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
    report = result.report
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
    p.add_argument("--parties", type=int, default=10)
    p.add_argument("--split", default="iid", help="iid | label:β | quantity:β | feature:σ")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--method", choices=METHODS, default="zscore")
    p.add_argument("--privacy", choices=("plain", "mhe"), default="plain")
    add_fit_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    add_quiet_option(p)
    p.set_defaults(handler=simulate_command)
